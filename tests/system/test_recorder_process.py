"""``amptrain recorder``: the recorder in a process of its own beside an API that runs
none (``AMPTRAIN_RECORDER_IN_API=false``), over a real uvicorn, Redis and database."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.redis import Keys
from tests.server.test_observability import scrape, value
from tests.server.web.ab_runs import spec
from tests.support.producer import Producer
from tests.support.stack import Stack, free_port, wait_until

pytestmark = pytest.mark.slow


def recorder_points(port: int) -> float:
    """``amptrain_recorder_points_total`` from a recorder process's own metrics port."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except httpx.TransportError:
        return -1.0
    for line in text.splitlines():
        if line.startswith("amptrain_recorder_points_total "):
            return float(line.split()[1])
    return 0.0


def test_a_recorder_process_records_for_an_api_without_one(
    database_url: str, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env["AMPTRAIN_RECORDER_IN_API"] = "false"
    feed: Producer | None = None
    try:
        stack.start_api()
        job_id = stack.submit(spec(name="apart", max_steps=1000))["id"]
        feed = Producer(redis_server.url, database_url, job_id)
        feed.start()
        feed.steps(1, 300)
        port = free_port()
        stack.spawn("recorder", ["recorder", "--metrics-port", str(port)])
        wait_until(lambda: stack.job(job_id)["step"] == 300, 60, "300 steps recorded")
        assert [p["step"] for p in stack.all_metrics(job_id)] == list(range(1, 301))
        assert recorder_points(port) == 300  # the recorder process wrote them ...
        assert value(scrape(stack), "amptrain_recorder_points_total") == 0  # ... not the API

        # SIGTERM: it commits what it holds, gives every job lock up and exits cleanly, so
        # the next recorder takes the job at once instead of after the lock's TTL.
        stack.kill("recorder", signal.SIGTERM)
        assert stack.processes["recorder"].returncode == 0, stack.log_tail("recorder")
        assert not redis.Redis.from_url(redis_server.url).exists(Keys.recorder_owner(job_id))
        feed.steps(301, 420)
        feed.finish()
        stack.spawn("recorder", ["recorder"])
        wait_until(lambda: stack.job(job_id)["step"] == 420, 60, "the rest recorded")
        assert [p["step"] for p in stack.all_metrics(job_id)] == list(range(1, 421))
    finally:
        if feed is not None:
            feed.close()
        stack.close()


def test_a_recorder_on_a_database_never_migrated_says_so(tmp_path: Path) -> None:
    env = {
        "AMPTRAIN_DATA_DIR": str(tmp_path),
        "AMPTRAIN_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}",
        "AMPTRAIN_REDIS_URL": "redis://127.0.0.1:1/0",  # never reached: the database is first
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "amptrain.cli.main", "recorder"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "run `amptrain db upgrade` first" in done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--metrics-port", "-1"], "--metrics-port"),
        (["--log-level", "loud"], "--log-level"),
        (["--metrics-port", "9", "--metrics-host", "no-such-host.invalid"], "cannot serve metrics"),
    ],
)
def test_bad_recorder_options_are_refused_by_name(
    args: list[str], says: str, tmp_path: Path
) -> None:
    env = {
        "AMPTRAIN_DATA_DIR": str(tmp_path),
        "AMPTRAIN_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "amptrain.cli.main", "recorder", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (1, 2), done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
