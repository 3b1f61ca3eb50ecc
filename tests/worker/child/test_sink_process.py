"""The sink process delivers every record the training process handed it, retries on its own
through a Redis outage, and never outlives the training process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.records import metric
from amptrain.contract.stream import decode
from amptrain.core.redis import Keys
from amptrain.worker.child.sink_process import ProcessSink
from tests.support.processes import running
from tests.support.stack import wait_until

J1 = "j_" + "5" * 32


def records(first: int, last: int) -> list[dict]:
    return [metric(step=s, loss=1.0 / s, skipped=False) for s in range(first, last + 1)]


def steps_in_stream(client: redis.Redis, job_id: str = J1) -> list[int]:
    return [decode(f)["step"] for _, f in client.xrange(Keys.telemetry(job_id))]


def test_records_arrive_in_order_and_close_waits_for_the_process(
    redis_server: EmbeddedRedis,
) -> None:
    sink = ProcessSink(redis_server.url, J1, attempt=3)
    assert sink.wait_ready(30)
    sink.write(records(1, 5))
    sink.write(records(6, 8))
    sink.close()
    assert not running(sink.pid)
    client = redis.Redis.from_url(redis_server.url)
    entries = [decode(f) for _, f in client.xrange(Keys.telemetry(J1))]
    assert [e["step"] for e in entries] == list(range(1, 9))
    assert {e["attempt"] for e in entries} == {3}


def test_an_outage_is_retried_by_the_sink_process_without_new_records(
    redis_server: EmbeddedRedis,
) -> None:
    sink = ProcessSink(redis_server.url, J1, attempt=1)
    sink.write(records(1, 10))
    client = redis.Redis.from_url(redis_server.url)
    wait_until(lambda: len(steps_in_stream(client)) == 10, 20, "the first ten records")
    redis_server.kill()
    sink.write(records(11, 20))  # must not raise: the training process keeps going
    redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    # No further write and no close: the sink process retries on its own.
    wait_until(lambda: sorted(set(steps_in_stream(client))) == list(range(1, 21)), 20, "steps 1-20")
    sink.close()


_TRAINING_PROCESS = """
import os, signal, sys
from amptrain.contract.records import metric
from amptrain.worker.child.sink_process import ProcessSink
sink = ProcessSink(sys.argv[1], sys.argv[2], attempt=1)
sink.write([metric(step=s, loss=1.0, skipped=False) for s in range(1, 31)])
print(sink.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close: the records are still in the pipe
"""


def test_the_sink_process_delivers_what_it_was_handed_and_dies_with_the_training_process(
    redis_server: EmbeddedRedis,
) -> None:
    training = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_TRAINING_PROCESS), redis_server.url, J1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert training.returncode == -9, training.stderr
    sink_pid = int(training.stdout.split()[0])
    wait_until(lambda: not running(sink_pid), 20, "the sink process to exit after its parent died")
    client = redis.Redis.from_url(redis_server.url)
    assert steps_in_stream(client) == list(range(1, 31))


def test_a_sink_process_that_died_makes_write_raise(redis_server: EmbeddedRedis) -> None:
    """The publisher counts a batch whose write raised as dropped: a dead sink is never silent."""
    sink = ProcessSink(redis_server.url, J1, attempt=1)
    os.kill(sink.pid, 9)
    wait_until(lambda: not running(sink.pid), 10, "the sink process to die")
    with pytest.raises(OSError):
        sink.write(records(1, 3))
    sink.close(timeout=1)
