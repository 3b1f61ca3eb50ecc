"""The stop of `amptrain up` when it cannot stop in order: a second Ctrl-C, and the bound.

Real processes (a child that ignores SIGTERM, as a worker still draining does, and a real
redis-server); the second Ctrl-C is a real SIGINT to this process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli import up_stop
from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.cli.up_stop import AT_ONCE_WAIT_S, Stopper
from amptrain.core import redis as core_redis
from amptrain.core.redis import Keys
from tests.support.stack import wait_until

JOB = "j_" + "0" * 32
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)


@pytest.fixture
def stubborn() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


def _second_ctrl_c() -> None:
    # Once the stop is under way (its handler is in place), as a person presses it again.
    wait_until(lambda: signal.getsignal(signal.SIGINT) is up_stop._stop_now, 10, "the stop")
    os.kill(os.getpid(), signal.SIGINT)


def test_a_second_ctrl_c_stops_at_once(stubborn: subprocess.Popen[bytes], tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    stopper = Stopper({"worker": stubborn}, server, server.url, bound_s=600)
    handler = signal.getsignal(signal.SIGINT)
    presser = threading.Thread(target=_second_ctrl_c)
    presser.start()
    began = time.monotonic()
    assert stopper.stop() is False
    presser.join()
    assert time.monotonic() - began < 2 * AT_ONCE_WAIT_S
    assert stubborn.poll() == -signal.SIGKILL
    assert server.process is None  # stopped, not left running
    assert signal.getsignal(signal.SIGINT) is handler  # this process's own Ctrl-C again


def test_past_the_bound_what_is_left_is_killed(
    stubborn: subprocess.Popen[bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    began = time.monotonic()
    assert Stopper({"worker": stubborn}, server, server.url, bound_s=1).stop() is False
    assert time.monotonic() - began < 1 + 2 * AT_ONCE_WAIT_S
    assert stubborn.poll() == -signal.SIGKILL and server.process is None
    said = capsys.readouterr().err
    assert "waiting for the worker" in said and "not stopped within 1 s" in said


def test_a_dead_recorder_is_not_waited_for(
    stubborn: subprocess.Popen[bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37: with the recorder crashed, the stop waited its whole bound for telemetry no
    one would record, then killed everything. It sees the recorder is gone and goes on."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    stopper = Stopper({"recorder": stubborn}, server, server.url, bound_s=30)
    client = core_redis.client(server.url)
    try:  # telemetry written while `up` ran, not in SQL: Keys.recorded(job) never set
        client.xadd(Keys.telemetry(JOB), {"kind": "metric"})
    finally:
        client.close()
    stubborn.kill()  # the recorder crashed
    stubborn.wait()
    began = time.monotonic()
    assert stopper.stop() is True
    assert time.monotonic() - began < 10
    err = capsys.readouterr().err
    assert "the recorder exited (status -9) with 1 job(s)' telemetry not yet in SQL" in err
    assert "not stopped within" not in err
    assert server.process is None
