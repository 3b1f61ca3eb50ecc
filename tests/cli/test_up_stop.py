"""`amptrain up` stopped mid-job every way it can stop: Ctrl-C in its terminal, SIGKILL, and
Ctrl-C after its Redis died first. Nothing it started outlives it, the stop keeps to its
bound, and the job, resumed by the next `up` each time, ends with every step in its history."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from amptrain.cli.up_stop import AT_ONCE_WAIT_S
from amptrain.core.settings import Settings
from tests.support.processes import alive
from tests.support.specs import service_job
from tests.support.stack import recorded_history, wait_until
from tests.support.up import Up, finished_job, start_up

pytestmark = pytest.mark.slow

# A stop and the next start each cost some steps, and an attempt trains on until the test
# sees its checkpoint recorded (a quiet CI machine ran 600 steps of attempt 3 meanwhile,
# and 900 ended the job inside the third stop): the job must outlast three by far.
STEPS = 3000
DEFAULT_BOUND_S: float = Settings.model_fields["stop_timeout_seconds"].default
SHORT_BOUND_S = 5.0  # where the orderly stop cannot finish: no need to wait out the default
SETTINGS = {
    # A job whose worker was killed waits out its lease before the next `up` resumes it.
    "AMPTRAIN_LEASE_SECONDS": "5",
    "AMPTRAIN_HEARTBEAT_SECONDS": "0.5",
    "AMPTRAIN_DISPATCH_INTERVAL_SECONDS": "0.5",
}


def ctrl_c(up: Up) -> float | None:
    """The terminal's Ctrl-C: SIGINT to `up`'s whole process group. It stops in order,
    within the default bound."""
    os.killpg(up.proc.pid, signal.SIGINT)
    assert up.proc.wait(DEFAULT_BOUND_S + 2 * AT_ONCE_WAIT_S) == 0, up.tail()
    text = up.log.read_text()
    assert "waiting for the worker: running jobs checkpoint" in text, up.tail()
    assert "waiting for Redis" in text, up.tail()
    assert "cannot see what the recorder has recorded" not in text, up.tail()  # Redis lived on
    return DEFAULT_BOUND_S


def kill_9(up: Up) -> float | None:
    """SIGKILL of `up` alone (the OOM killer, `kill -9`): its children die with it."""
    up.proc.kill()
    up.proc.wait(10)
    return None


def redis_first(up: Up) -> float | None:
    """Redis dies first, then Ctrl-C (``up`` started with :data:`SHORT_BOUND_S`): the
    worker still drains (no Redis needed to tell it), but its telemetry cannot go out, so
    at the bound what is left is stopped at once."""
    (server,) = [p for p in up.descendants() if _names([p]) == ["redis-server"]]
    server.kill()
    os.killpg(up.proc.pid, signal.SIGINT)
    assert up.proc.wait(SHORT_BOUND_S + 2 * AT_ONCE_WAIT_S) == 1, up.tail()
    assert f"not stopped within {SHORT_BOUND_S:g} s" in up.log.read_text(), up.tail()
    return SHORT_BOUND_S + AT_ONCE_WAIT_S


STOPS: list[tuple[Callable[[Up], float | None], dict[str, str]]] = [
    (ctrl_c, {}),
    (kill_9, {}),
    (redis_first, {"AMPTRAIN_STOP_TIMEOUT_SECONDS": str(SHORT_BOUND_S)}),
]


def test_no_stop_of_up_leaves_a_gap_or_a_process(tmp_path: Path) -> None:
    data, job_id, attempt = tmp_path / "data", "", 0
    for n, (stop, settings) in enumerate(STOPS):
        up = start_up(tmp_path, data, os.setsid, {**SETTINGS, **settings}, f"up-{n}.log")
        job_id, attempt = _stop_mid_job(up, stop, job_id, attempt)

    up = start_up(tmp_path, data, os.setsid, SETTINGS, "up-last.log")
    try:
        client = up.admin_client()
        done = finished_job(client, job_id, 240)
        assert done["status"] == "succeeded", (done["error"], up.tail())
        assert done["attempt"] > len(STOPS)
        steps = [p["step"] for p in recorded_history(client, job_id, STEPS)]
        assert steps == list(range(1, STEPS + 1))  # every step, once, in order
    finally:
        up.stop()


def _stop_mid_job(
    up: Up, stop: Callable[[Up], float | None], job_id: str, attempt: int
) -> tuple[str, int]:
    """Submit the job if ``job_id`` is empty; once a newer attempt than ``attempt`` has
    checkpointed, stop ``up`` with ``stop``: within its bound, leaving nothing running."""
    try:
        client = up.admin_client()
        job_id = job_id or _submit(client)
        attempt = _checkpointed_again(client, job_id, attempt, up)
        started = up.descendants()
        assert "redis-server" in _names(started)  # the snapshot holds everything
        began = time.monotonic()
        bound = stop(up)
        took = time.monotonic() - began
    finally:
        up.proc.kill()  # only if a failed step left it running
        up.proc.wait(30)
    print(f"{stop.__name__}: stopped in {took:.1f} s (attempt {attempt})")
    assert bound is None or took <= bound, up.tail()
    wait_until(lambda: not alive(started), 10, f"what `up` started to die ({stop.__name__})")
    return job_id, attempt


def _submit(client: httpx.Client) -> str:
    spec = service_job(
        max_steps=STEPS,
        max_attempts=6,  # two of the stops kill its worker, which costs an attempt each
        checkpoint={"every_steps": 20, "keep_last": 3},
        telemetry={"flush_every_steps": 5, "flush_every_ms": 100},
    )
    r = client.post("/jobs", json=spec)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _checkpointed_again(client: httpx.Client, job_id: str, before: int, up: Up) -> int:
    """Wait until a newer attempt than ``before`` trains and has recorded a checkpoint (so
    this stop lands mid-job, past a checkpoint of its own); that attempt."""

    def newer() -> int:
        job = client.get(f"/jobs/{job_id}").json()
        assert job["status"] != "succeeded", "the job ended before the stop: make it longer"
        if job["attempt"] <= before:
            return 0
        events = client.get(f"/jobs/{job_id}/events").json()["items"]
        ok = any(e["type"] == "checkpoint" and e["attempt"] == job["attempt"] for e in events)
        return int(job["attempt"]) if ok else 0

    try:
        return wait_until(newer, 120, "a checkpoint of a new attempt")
    except AssertionError:
        raise AssertionError(up.tail()) from None


def _names(processes: list[psutil.Process]) -> list[str]:
    names = []
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):  # a helper that exited meanwhile
            names.append(p.name())
    return names


def test_a_crashed_recorder_is_not_waited_for(tmp_path: Path) -> None:
    """Issue 37: the recorder killed mid-job, `up` stopped (a part died) but waited its whole
    bound for the drained job's telemetry, which no one would record. It stops promptly now,
    naming the dead recorder, and still exits 1: a part of it crashed."""
    up = start_up(tmp_path, tmp_path / "data", os.setsid, SETTINGS)
    try:
        client = up.admin_client()
        job_id = _submit(client)
        wait_until(
            lambda: client.get(f"/jobs/{job_id}/metrics").json()["items"], 120, "a step recorded"
        )
        (recorder,) = [
            p for p in up.descendants() if p.cmdline()[-1:] == ["recorder"]
        ]  # `python -m amptrain.cli.main recorder`
        began = time.monotonic()
        recorder.kill()
        status = up.proc.wait(DEFAULT_BOUND_S + 2 * AT_ONCE_WAIT_S)
        took = time.monotonic() - began
    finally:
        up.proc.kill()  # only if a failed step left it running
        up.proc.wait(30)
    text = up.log.read_text()
    assert status == 1, up.tail()
    assert "recorder exited; shutting down" in text, up.tail()
    assert "the recorder exited (status -9) with 1 job(s)' telemetry not yet in SQL" in text
    assert "not stopped within" not in text, up.tail()
    # The worker's drain takes what it takes (seconds); the bound is no longer waited out.
    assert took < DEFAULT_BOUND_S, up.tail()
