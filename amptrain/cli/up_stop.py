"""How ``amptrain up`` stops what it started: in order, within a bound, at once if asked.

In order (the first Ctrl-C or SIGTERM): the worker drains (it takes no new job; running
jobs checkpoint at their next step boundary and go back to the queue, their telemetry
delivered to Redis), then ``up`` waits until the recorder has committed to SQL every
stream entry written while it ran (unless the recorder has exited: the entries stay in
Redis for the next one), then stops the recorder, the API and Redis last.

At once (a second Ctrl-C, or the graceful stop still running after
``AMPTRAIN_STOP_TIMEOUT_SECONDS``): every process group left is killed, Redis is
stopped with SIGTERM (it writes its append-only file first). What SQL holds stays:
each recorder transaction commits whole or not at all, and a job resumes from no
checkpoint beyond its recorded history (:mod:`amptrain.worker.pool.resume_bound`), so the
steps whose telemetry was still in flight are trained and recorded again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import click
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.cursor import Cursor
from amptrain.core import redis as core_redis
from amptrain.core.redis import Keys

POLL_S = 0.1
WORKER_PART = "worker"
"""The part name of ``up``'s one-device worker; a shape worker's is ``worker cpu-x2``
(:mod:`amptrain.cli.up_shapes`). Every worker part drains first."""
AT_ONCE_WAIT_S = 5.0
"""How long a stop at once waits for each process it killed or Redis it terminated."""


class StopNow(Exception):
    """A second Ctrl-C (or SIGTERM) during the graceful stop."""


class Overdue(Exception):
    """The graceful stop ran past its bound."""


def say(text: str) -> None:
    click.echo(f"amptrain up: {text}", err=True)


@dataclass
class Stopper:
    """The processes ``up`` started (by name, each the leader of its own process group),
    its Redis, and when it started (stream entries written since are waited for)."""

    parts: dict[str, subprocess.Popen[bytes]]
    redis_server: EmbeddedRedis | None
    redis_url: str
    bound_s: float
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def stop(self) -> bool:
        """Stop everything; True if it stopped in order within the bound."""
        began = time.monotonic()
        orderly = False
        before = {sig: signal.signal(sig, _stop_now) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._in_order(began + self.bound_s)
            orderly = True
        except StopNow:
            say("asked again: stopping everything now")
        except Overdue:
            say(f"not stopped within {self.bound_s:g} s: stopping everything now")
        finally:
            for sig in before:
                signal.signal(sig, signal.SIG_IGN)  # nothing interrupts the kill
            self._at_once()
            for sig, handler in before.items():
                signal.signal(sig, handler)
        say(f"stopped in {time.monotonic() - began:.1f} s")
        return orderly

    def _in_order(self, deadline: float) -> None:
        say("press Ctrl-C again to stop at once")
        workers = [n for n in self.parts if n.startswith(WORKER_PART)]
        self._end(
            workers,
            f"the worker{'s' if len(workers) > 1 else ''}: running jobs checkpoint at their "
            "next step and go back to the queue",
            deadline,
        )
        self._wait_recorded(deadline)
        # Both at once: neither needs the other once everything is recorded.
        self._end(
            ["recorder", "api"],
            "the recorder and the API" if "recorder" in self.parts else "the API",
            deadline,
        )
        if self.redis_server is not None:
            say("waiting for Redis to write its append-only file and exit")
            self.redis_server.stop(max(deadline - time.monotonic(), 0.1))

    def _end(self, names: list[str], what: str, deadline: float) -> None:
        procs = [self.parts[n] for n in names if n in self.parts]
        running = [p for p in procs if p.poll() is None]
        if running:
            say(f"waiting for {what}")
        for proc in running:
            proc.send_signal(signal.SIGTERM)  # the leader only: it stops its own group
        for proc in running:
            _wait(proc, deadline)
        for proc in procs:
            _kill_group(proc)  # anything of its group that outlived it

    def _wait_recorded(self, deadline: float) -> None:
        client = core_redis.client(self.redis_url)
        told = -1
        recorder = self.parts.get("recorder")
        try:
            while behind := self._unrecorded(client):
                if recorder is not None and (status := recorder.poll()) is not None:
                    # No one records it now: waiting out the bound only ended in a kill.
                    say(
                        f"the recorder exited (status {status}) with {len(behind)} job(s)' "
                        "telemetry not yet in SQL; not waiting for it: it stays in Redis "
                        "for the next recorder"
                    )
                    return
                if len(behind) != told:
                    told = len(behind)
                    say(f"waiting for the recorder: {told} job(s) with telemetry not yet in SQL")
                if time.monotonic() >= deadline:
                    raise Overdue
                time.sleep(POLL_S)
        except redis.RedisError as exc:
            say(f"cannot see what the recorder has recorded ({exc}); not waiting for it")
        finally:
            client.close()

    def _unrecorded(self, client: redis.Redis) -> list[str]:
        """Jobs whose stream has entries written while ``up`` ran that SQL has not."""
        behind = []
        for key in client.scan_iter(match=Keys.TELEMETRY_PATTERN, count=1000, _type="stream"):
            newest: Any = client.xrevrange(key, count=1)
            if not newest or Cursor.of_entry(newest[0][0]).ms < self.started_ms:
                continue
            job_id = Keys.job_of_telemetry(key)
            recorded = client.get(Keys.recorded(job_id))
            if recorded is None or Cursor.of_entry(recorded) < Cursor.of_entry(newest[0][0]):
                behind.append(job_id)
        return behind

    def _at_once(self) -> None:
        for proc in self.parts.values():
            _kill_group(proc)
        for proc in self.parts.values():
            try:
                proc.wait(AT_ONCE_WAIT_S)
            except subprocess.TimeoutExpired:
                say(f"process {proc.pid} did not exit after SIGKILL")
        if self.redis_server is not None:
            self.redis_server.stop(AT_ONCE_WAIT_S)


def _stop_now(signum: int, frame: object) -> None:
    raise StopNow


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> None:
    try:
        proc.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        raise Overdue from None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Its own group (`up` started it as a session leader): the worker's pool processes,
    # training children and sink processes go with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
