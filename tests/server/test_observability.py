"""Prometheus GET /metrics and structured logs, against the real service processes."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.logs import configure_logging, log_context
from tests.support.specs import mlp_job
from tests.support.stack import Stack, free_port, wait_until

# -- logs -------------------------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs_carry_job_attempt_and_worker(captured: io.StringIO) -> None:
    configure_logging("json", component="worker", stream=captured)
    log = logging.getLogger("amptrain.test")
    with log_context(job_id="j_1", worker="w@host"):
        log.info("claimed %s", "j_1", extra={"attempt": 2})
        with log_context(attempt=3):
            log.warning("slow")
    log.info("outside")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [line["message"] for line in lines] == ["claimed j_1", "slow", "outside", "failed"]
    first, second, outside, failed = lines
    assert (first["job_id"], first["attempt"], first["worker"]) == ("j_1", 2, "w@host")
    assert (second["attempt"], second["level"], second["component"]) == (3, "warning", "worker")
    assert "job_id" not in outside and outside["logger"] == "amptrain.test"
    assert "ValueError: boom" in failed["exception"]
    assert first["time"].endswith("Z")


def test_text_logs_are_one_readable_line(captured: io.StringIO) -> None:
    configure_logging("text", component="api", stream=captured)
    with log_context(job_id="j_9", attempt=1):
        logging.getLogger("amptrain.test").info("started")
    (line,) = captured.getvalue().splitlines()
    assert line.endswith("INFO    amptrain.test [j_9 #1] started")


# -- GET /metrics ---------------------------------------------------------------


def scrape(stack: Stack) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    r = httpx.get(f"{stack.client.base_url}/metrics", timeout=30)  # no token: scrapers have none
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(series: dict[Any, float], name: str, **labels: str) -> float:
    return series.get((name, frozenset(labels.items())), 0.0)


def route_requests(series: dict[Any, float], route: str) -> float:
    return sum(
        v
        for (name, labels), v in series.items()
        if name == "amptrain_http_request_duration_seconds_count" and ("route", route) in labels
    )


def test_queue_depth_covers_every_configured_queue(api_stack: Stack) -> None:
    # The stack serves gpu, cpu and gpu-a100 (AMPTRAIN_QUEUES) and runs no worker; each
    # also has its derived shape queues -x2..-x8 for data-parallel jobs.
    api_stack.submit(mlp_job(3, device="cuda", queue="gpu-a100"))
    api_stack.submit(mlp_job(4, batch_size=32, device="cpu", devices=2))
    for queue in ("gpu-a100", "cpu-x2"):
        wait_until(
            lambda q=queue: value(scrape(api_stack), "amptrain_queue_depth", queue=q) == 1,
            30,
            f"queue depth 1 on the {queue} queue",
        )
    series = scrape(api_stack)
    depths = {
        dict(labels)["queue"]: v
        for (name, labels), v in series.items()
        if name == "amptrain_queue_depth"
    }
    shapes = {f"{q}-x{k}": 0 for q in ("gpu", "cpu", "gpu-a100") for k in range(2, 9)}
    assert depths == {"gpu": 0, "cpu": 0, "gpu-a100": 1, **shapes, "cpu-x2": 1}


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env["AMPTRAIN_LOG_FORMAT"] = "json"
    s.env["AMPTRAIN_WORKER_METRICS_PORT"] = str(free_port())
    s.start_api()
    yield s
    s.close()


@pytest.mark.slow
def test_metrics_move_when_a_job_runs(stack: Stack) -> None:
    before = scrape(stack)
    for status in ("queued", "running", "succeeded", "failed", "cancelled"):
        assert ("amptrain_jobs", frozenset({("status", status)})) in before
    assert value(before, "amptrain_live_watchers") == 0

    # No worker yet: the job waits in the broker's cpu queue.
    job = stack.submit(
        mlp_job(
            20,
            name="metrics",
            precision="fp32",
            batch_size=16,
            telemetry={"flush_every_steps": 5, "flush_every_ms": 100},
        )
    )
    wait_until(
        lambda: value(scrape(stack), "amptrain_queue_depth", queue="cpu") == 1,
        30,
        "queue depth 1 on the cpu queue",
    )
    waiting = scrape(stack)
    assert value(waiting, "amptrain_jobs", status="queued") == 1
    assert value(waiting, "amptrain_queue_depth", queue="gpu") == 0

    stack.start_worker()
    stack.wait_for_status(job["id"], "succeeded")
    wait_until(lambda: stack.job(job["id"])["step"] == 20, 30, "all 20 points recorded")
    after = scrape(stack)
    assert value(after, "amptrain_jobs", status="succeeded") == 1
    assert value(after, "amptrain_jobs", status="queued") == 0
    assert value(after, "amptrain_queue_depth", queue="cpu") == 0
    recorded = value(after, "amptrain_recorder_points_total") - value(
        before, "amptrain_recorder_points_total"
    )
    assert recorded == 20
    assert value(after, "amptrain_recorder_batches_total") >= 1
    assert value(after, "amptrain_recorder_lag_seconds_count") >= 1
    assert value(after, "amptrain_recorder_last_point_timestamp_seconds") > 0
    # Submit -> first claim, observed once for this job; it waited for the worker to start.
    assert value(after, "amptrain_dispatch_latency_seconds_count") == 1
    assert value(after, "amptrain_dispatch_latency_seconds_sum") > 0
    # Request latency by route template, not by raw path.
    assert route_requests(after, "/jobs/{job_id}") > route_requests(before, "/jobs/{job_id}")
    assert not any(("route", f"/jobs/{job['id']}") in labels for (_n, labels) in after), (
        "raw paths must not become labels"
    )
    assert value(after, "amptrain_dispatch_latency_seconds_count") == value(
        scrape(stack), "amptrain_dispatch_latency_seconds_count"
    ), "a job is observed once"

    # Logs: one JSON object per line, lines about the job carry job_id, attempt and worker.
    claimed = [
        line
        for line in _json_lines(stack.root / "worker.log")
        if line.get("job_id") == job["id"] and "claimed" in line["message"]
    ]
    assert claimed and claimed[0]["attempt"] == 1 and claimed[0]["worker"] == "worker@test"
    api_lines = _json_lines(stack.root / "api.log")
    assert any(line["logger"] == "uvicorn.access" for line in api_lines)


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """Every log line that is a JSON object (Celery's start banner goes to stdout as text)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out
