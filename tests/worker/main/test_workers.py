"""GPU capability report and GET /workers: a real worker process announces itself, its
devices and the job it runs; it leaves the list when it stops."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.redis import client as redis_client
from amptrain.store import tokens
from amptrain.store.db import make_engine, make_session_factory
from amptrain.worker.main import devices, metrics
from tests.support.cpu_verdict import expected_cpu_auto, expected_measured
from tests.support.specs import mlp_job
from tests.support.stack import Stack, free_port, wait_until

CPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def long_cpu_job(**overrides: Any) -> dict[str, Any]:
    return mlp_job(
        **{
            "name": "long",
            "precision": "auto",
            "batch_size": 16,
            "max_steps": 1_000_000,
            "telemetry": {"flush_every_steps": 5, "flush_every_ms": 100},
            **overrides,
        }
    )


def test_capability_report_on_a_cpu_host() -> None:
    report = devices.gather(env=CPU_ENV)
    assert "error" not in report, report
    assert report["cuda_available"] is False
    assert report["versions"]["torch"] and report["versions"]["python"]
    (cpu,) = report["devices"]
    assert cpu["type"] == "cpu"
    assert isinstance(cpu["name"], str) and cpu["name"]
    assert cpu["cores"] >= 1 and cpu["memory_bytes"] > 0
    assert isinstance(cpu["amx"], bool) and isinstance(cpu["avx512_bf16"], bool)
    assert cpu["bf16_probe"]["fp32_ms"] > 0 and cpu["bf16_probe"]["bf16_ms"] > 0
    # What `precision: auto` picks here follows the flags and the report's own bf16 probe.
    assert cpu["auto_precision"]["effective"] == expected_cpu_auto(cpu)
    assert "CPU" in cpu["auto_precision"]["reason"]
    # The start-up log line carries the flags and the probe the verdict came from.
    line = devices.summary(report)
    assert f"amx={cpu['amx']} avx512_bf16={cpu['avx512_bf16']} " in line
    assert f"bf16_probe={cpu['bf16_probe']['speedup']:.2f}x (fp32 " in line
    assert f"auto={cpu['auto_precision']['effective']}" in line


def test_capability_report_names_a_failure_instead_of_raising() -> None:
    report = devices.gather(env=CPU_ENV, timeout=0.001)
    assert report["devices"] == [] and "timed out" in report["error"]


@pytest.mark.gpu
def test_capability_report_on_a_cuda_host() -> None:
    report = devices.gather()
    assert report["cuda_available"] is True, report
    v = report["versions"]
    assert v["cuda"] and v["cudnn"] and v["nccl"] and v["torch"]
    gpus = [d for d in report["devices"] if d["type"] == "cuda"]
    assert gpus
    for gpu in gpus:
        major = int(gpu["compute_capability"].split(".")[0])
        assert gpu["memory_bytes"] > 2**30
        assert gpu["tensor_cores"] is (major >= 7)
        assert gpu["bf16"] is (major >= 8)
        expected = "bf16" if major >= 8 else "fp16" if major == 7 else "fp32"
        assert gpu["auto_precision"]["effective"] == expected


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env["AMPTRAIN_WORKER_METRICS_PORT"] = str(free_port())
    s.start_api()
    s.start_worker()
    yield s
    s.close()


def listed(stack: Stack, name: str = "worker@test") -> dict[str, Any] | None:
    items = stack.client.get("/workers").json()["items"]
    return next((w for w in items if w["name"] == name), None)


def scrape(port: str | int, host: str = "127.0.0.1") -> str:
    return httpx.get(f"http://{host}:{port}/metrics", timeout=10).text


def worker_metrics(port: str) -> dict[tuple[str, str], float]:
    """Each series by name and slot (worker-wide series have no slot)."""
    return {
        (s.name, s.labels.get("slot", "")): s.value
        for family in text_string_to_metric_families(scrape(port))
        for s in family.samples
    }


def outside_address() -> str | None:
    """This machine's address on its network (not loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def reachable(host: str, port: str | int) -> bool:
    try:
        scrape(port, host)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.slow
def test_workers_lists_a_running_worker_its_devices_and_its_job(
    stack: Stack, database_url: str
) -> None:
    assert httpx.get(f"{stack.client.base_url}/workers").status_code == 401
    worker = wait_until(lambda: listed(stack), 60, "the worker in GET /workers")
    assert worker is not None
    assert worker["queues"] == ["gpu", "cpu"] and worker["concurrency"] == 1
    assert worker["current_jobs"] == [] and worker["last_heartbeat"] > 0
    cpu = next(d for d in worker["devices"] if d["type"] == "cpu")
    assert cpu["cores"] >= 1 and isinstance(cpu["amx"], bool)
    assert worker["versions"]["torch"]
    # What a training process could get here, for the API's memory check at submit.
    assert 0 < worker["memory_available_bytes"] <= worker["memory_total_bytes"]

    job = stack.submit(long_cpu_job())
    assert job["notice"] is None  # this worker takes the job's queue
    busy = wait_until(
        lambda: (
            (w := listed(stack)) and w["current_jobs"] and w["current_jobs"][0].get("step") and w
        ),
        60,
        "the job's progress in GET /workers",
    )
    assert busy
    (slot,) = busy["current_jobs"]
    assert slot["job_id"] == job["id"] and slot["attempt"] == 1
    # While it trains, the figure stays the one measured idle (the job's own memory is
    # not what the next job would lack).
    later = wait_until(
        lambda: (w := listed(stack)) and w["last_heartbeat"] > busy["last_heartbeat"] and w,
        30,
        "another heartbeat",
    )
    assert (
        later["current_jobs"] and later["memory_available_bytes"] == busy["memory_available_bytes"]
    )
    assert slot["samples_per_second"] > 0 and slot["memory_peak"] > 0

    # The worker's own Prometheus endpoint shows the same work, per slot: it has no
    # authentication, so it names no job and listens on loopback only.
    port = stack.env["AMPTRAIN_WORKER_METRICS_PORT"]
    series = worker_metrics(port)
    assert series[("amptrain_worker_busy_slots", "")] == 1
    assert series[("amptrain_worker_job_samples_per_second", "0")] > 0
    assert series[("amptrain_worker_job_step", "0")] >= 1
    assert job["id"] not in scrape(port) and "job_id" not in scrape(port)
    address = outside_address()
    if address:
        assert not reachable(address, port)

    # Someone else's job: the slot shows as busy, without the job.
    engine = make_engine(database_url)
    with make_session_factory(engine).begin() as s:
        bob = tokens.create_token(s, "bob")
    engine.dispose()
    as_bob = stack.client.get("/workers", headers={"Authorization": f"Bearer {bob}"}).json()
    # Bob sees neither where workers run nor the job he may not see.
    bob_view = next(w for w in as_bob["items"] if w["queues"] == ["gpu", "cpu"])
    assert "name" not in bob_view and "hostname" not in bob_view and "pid" not in bob_view
    assert bob_view["current_jobs"] == [{"slot": 0, "gpu": None, "gpus": []}]

    # `auto` on this CPU, and the reason names the device it was decided for.
    precision = stack.job(job["id"])["precision"]
    assert precision["requested"] == "auto" and "device: cpu" in precision["reason"]

    assert stack.client.post(f"/jobs/{job['id']}/cancel").status_code == 202
    stack.wait_for_status(job["id"], "cancelled", timeout=30)
    # The cancel is recorded at the step the job stopped at, the step the job shows (the
    # event comes after that step's point in the stream, so both are recorded by now).
    event = wait_until(
        lambda: next((e for e in stack.events(job["id"]) if e["type"] == "cancelled"), None),
        30,
        "the cancelled event",
    )
    assert event["step"] == stack.job(job["id"])["step"] > 0
    wait_until(lambda: (listed(stack) or {}).get("current_jobs") == [], 30, "the slot to clear")
    assert worker_metrics(port)[("amptrain_worker_busy_slots", "")] == 0

    # A clean stop leaves the list at once (a crash: after the TTL).
    stack.kill("worker", signal.SIGTERM)
    assert listed(stack) is None


@pytest.mark.gpu
@pytest.mark.slow
def test_workers_reports_its_gpu_and_auto_precision_names_it(
    database_url: str, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    s = Stack(tmp_path, database_url, redis_server)
    del s.env["CUDA_VISIBLE_DEVICES"]  # the stack hides GPUs by default
    s.env["AMPTRAIN_WORKER_METRICS_PORT"] = str(free_port())
    try:
        s.start_api()
        s.start_worker()
        worker = wait_until(lambda: listed(s), 120, "the GPU worker in GET /workers")
        assert worker is not None
        gpu = next(d for d in worker["devices"] if d["type"] == "cuda")
        assert gpu["compute_capability"] and gpu["memory_bytes"] > 0
        assert worker["versions"]["cuda"] and worker["versions"]["cudnn"]
        spec = long_cpu_job(device="cuda", max_steps=50)
        job = s.submit(spec)
        done = s.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
        assert done["status"] == "succeeded", done["error"]
        # auto measured the job's model (bf16 or fp16 against tf32/fp32), not the report's
        # capability rule: the verdict is what the ratio in its own reason calls for.
        assert done["precision"]["effective"] == expected_measured(done["precision"])
        assert gpu["name"] in done["precision"]["reason"]
    finally:
        s.close()


def test_the_metrics_endpoint_listens_where_it_is_told(session_redis: EmbeddedRedis) -> None:
    address = outside_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    client = redis_client(session_redis.url)
    for host, outside in (("127.0.0.1", False), ("0.0.0.0", True)):
        port = free_port()
        server = metrics.serve(client, "w@metrics-test", 1, host, port)
        assert server is not None
        try:
            assert "amptrain_worker_slots 1.0" in scrape(port)
            assert reachable(address, port) is outside
        finally:
            server.shutdown()
            server.server_close()
    assert metrics.serve(client, "w@metrics-test", 1, "127.0.0.1", 0) is None  # 0: disabled
