"""Hostile job specs against the real service (issue 11, findings 2, 3, 7, 9 and names).

At submit time (the API alone, default settings but a memory limit) bad specs are 422s naming the field.
Behind it (API, Celery worker, training child, private redis-server) the worker refuses
what got past an API set up more permissively, without touching the network, and every
failure is classed so that nothing is retried in vain: a network probe, an unreadable
file, a model too large for the device, an allocation failure, a run past its
wall-clock limit. Error messages name the problem, never file content or paths.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.components.test_tensors_hostile import SECRET, Listener
from tests.server.web.test_http import fields
from tests.support.specs import mlp_job
from tests.support.stack import Stack, user_client

pytestmark = pytest.mark.slow


def _tensors(path: str, **extra: Any) -> dict[str, Any]:
    return mlp_job(5, dataset={"name": "tensors", "args": {"path": path}}, **extra)


@pytest.fixture
def limited_api(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    """The API alone with defaults, plus an operator's limit on a job's memory (unset, only
    the live workers' memory limits a job, and this stack has none)."""
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env["AMPTRAIN_MAX_JOB_MEMORY_GIB"] = "256"
    stack.start_api()
    yield stack
    stack.close()


def test_bad_specs_are_422s_naming_the_field(limited_api: Stack) -> None:
    c = limited_api.client
    listener = Listener()
    try:
        probe = c.post("/jobs", json=_tensors(f"ftp://127.0.0.1:{listener.port}/x.csv"))
        assert fields(probe) == {"dataset.args.path"}
        assert "protocol 'ftp' is not allowed" in probe.json()["detail"][0]["message"]
        assert listener.connections_besides_a_sentinel() == []
    finally:
        listener.close()
    cases: list[tuple[dict[str, Any], set[str]]] = [
        (mlp_job(batch_size=10**30), {"batch_size"}),
        (mlp_job(max_steps=2**31), {"max_steps"}),
        (mlp_job(seed=10**30), {"seed"}),
        (mlp_job(checkpoint={"every_steps": 1, "keep_last": 10**9}), {"checkpoint.keep_last"}),
        (mlp_job(model={"name": "mlp", "args": {"width": 10**12}}), {"model.args.width"}),
        (
            mlp_job(dataset={"name": "synthetic-images", "args": {"height": 100_000}}),
            {"dataset.args.height"},
        ),
        (mlp_job(optimizer={"betas": [5, 5]}), {"optimizer.betas.0", "optimizer.betas.1"}),
        (mlp_job(optimizer={"eps": 0}), {"optimizer.eps"}),
        (mlp_job(name="evil\x1b[2J"), {"name"}),
        (mlp_job(max_runtime_s=30 * 24 * 3600), {"max_runtime_s"}),  # above the default limit
        (
            # Parameters alone: several TiB, past the operator's 256 GiB.
            mlp_job(model={"name": "mlp", "args": {"width": 65536, "depth": 64}}),
            {"model.args"},
        ),
        (_tensors("/etc/passwd"), {"dataset.args.path"}),
        (_tensors("simplecache::s3://b/x.npz"), {"dataset.args.path"}),
    ]
    for spec, expected in cases:
        assert fields(c.post("/jobs", json=spec)) == expected, spec
    # NaN and Infinity as an HTTP client sends them: bare JSON tokens.
    for token in ("NaN", "Infinity", "-Infinity"):
        body = json.dumps(mlp_job(optimizer={"lr": 0.001})).replace("0.001", token)
        r = c.post("/jobs", content=body, headers={"Content-Type": "application/json"})
        assert fields(r) == {"optimizer.lr"}, body
    too_large = c.post("/jobs", json=cases[10][0]).json()["detail"][0]["message"]
    assert "parameters need" in too_large and "256.0 GiB" in too_large
    assert c.get("/jobs").json()["items"] == []  # nothing was created by the bad requests


def test_bounds_are_documented_in_the_catalog_and_the_openapi_schema(api_stack: Stack) -> None:
    catalog = api_stack.client.get("/catalog").json()
    assert catalog["limits"]["batch_size"] == {"minimum": 1, "maximum": 65536}
    width = next(a for a in catalog["models"]["mlp"]["args"] if a["name"] == "width")
    assert (width["minimum"], width["maximum"]) == (1, 65536)
    schema = api_stack.client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["JobSpec"]["properties"]["max_steps"]["maximum"] == 10_000_000
    betas = schema["OptimizerSpec"]["properties"]["betas"]["prefixItems"]
    assert all(b["exclusiveMaximum"] == 1 and b["minimum"] == 0 for b in betas)


def test_per_user_data_roots_at_submit(
    database_url: str, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env["AMPTRAIN_DATA_ROOTS_PER_USER"] = "true"
    stack.start_api()
    try:
        with user_client(stack, "alice") as alice, user_client(stack, "bob") as bob:
            root = tmp_path / "data"  # the default data root under AMPTRAIN_DATA_DIR
            assert alice.post("/jobs", json=_tensors("mine.npz")).status_code == 201
            assert fields(bob.post("/jobs", json=_tensors("../alice/mine.npz"))) == {
                "dataset.args.path"
            }
            theirs = bob.post("/jobs", json=_tensors(str(root / "alice" / "mine.npz")))
            assert fields(theirs) == {"dataset.args.path"}
            assert str(root) not in theirs.text
            ok = bob.post("/jobs", json=_tensors(str(root / "bob" / "mine.npz")))
            assert ok.status_code == 201, ok.text
    finally:
        stack.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def lenient_api_strict_worker(
    database_url: str, redis_server: EmbeddedRedis, tmp_path: Path, listener: Listener
) -> Iterator[Stack]:
    """An API that admits more than its worker allows (a configuration drift, or a spec
    queued before the operator tightened the settings): the worker must hold the line."""
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env.update(
        {
            "AMPTRAIN_DATA_ROOTS_PER_USER": "true",
            "AMPTRAIN_DATA_PROTOCOLS": "file,ftp",
            "AMPTRAIN_DATA_ROOTS": f"{tmp_path / 'data'},ftp://127.0.0.1:{listener.port}/shared",
            "AMPTRAIN_MAX_JOB_MEMORY_GIB": "1000000000",
            "OMP_NUM_THREADS": "1",
        }
    )
    stack.start_api()
    for name in ("AMPTRAIN_DATA_PROTOCOLS", "AMPTRAIN_DATA_ROOTS", "AMPTRAIN_MAX_JOB_MEMORY_GIB"):
        del stack.env[name]  # the worker keeps the defaults: local files only
    # The test starts the worker once it submitted: with a live worker the API would refuse
    # the jobs too large for its memory at submit.
    yield stack
    stack.close()


def _failed_once(stack: Stack, job_id: str) -> dict[str, Any]:
    job = stack.wait_for_status(job_id, "failed", "succeeded", timeout=240)
    assert job["status"] == "failed", job
    assert job["attempt"] == 1, job  # not retried: another attempt would fail the same way
    return dict(job["error"])


def test_the_worker_refuses_what_got_past_the_api(
    lenient_api_strict_worker: Stack, listener: Listener, tmp_path: Path
) -> None:
    stack = lenient_api_strict_worker
    alice_root = tmp_path / "data" / "alice"
    alice_root.mkdir(parents=True)
    (alice_root / "secret.csv").write_text(f"1.0,2.0,0\n3.0,{SECRET},1\n")
    with user_client(stack, "alice") as alice:

        def submit(spec: dict[str, Any]) -> str:
            r = alice.post("/jobs", json=spec)
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        probe = submit(_tensors(f"ftp://127.0.0.1:{listener.port}/shared/alice/x.csv"))
        unreadable = submit(_tensors("secret.csv"))  # relative: under ROOT/alice
        too_large = submit(mlp_job(5, model={"name": "mlp", "args": {"width": 65536, "depth": 64}}))
        no_memory = submit(
            mlp_job(
                5,
                dataset={
                    "name": "synthetic-classification",
                    "args": {"features": 8192, "num_samples": 10_000_000},
                },
            )
        )
        stack.start_worker("w1")
        error = _failed_once(stack, probe)
        assert error["code"] == "invalid_spec"
        assert "protocol 'ftp' is not allowed" in error["message"]
        assert SECRET not in error["message"]
        assert listener.connections_besides_a_sentinel() == []

        error = _failed_once(stack, unreadable)
        assert error["code"] == "invalid_spec"
        assert error["message"].startswith("dataset.args.path: cannot load 'secret.csv' as .csv")
        for leak in (SECRET, str(tmp_path), "alice/secret.csv"):
            assert leak not in error["message"]

        error = _failed_once(stack, too_large)
        assert error["code"] == "too_large"
        assert "parameters" in error["message"]
        assert (
            "the training process has" in error["message"] and "available here" in error["message"]
        )

        # Refused before its first allocation (was an 'oom' from the allocator, after it
        # had allocated what it could).
        error = _failed_once(stack, no_memory)
        assert error["code"] == "too_large", error
        assert error["message"].startswith(
            "too large for this worker: the dataset 'synthetic-classification' needs about"
        )
    log = stack.log_tail("w1", 2000)
    assert "DefaultCPUAllocator" not in log


def test_a_job_past_its_wall_clock_limit_checkpoints_and_fails_with_timeout(
    database_url: str, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env["OMP_NUM_THREADS"] = "1"
    stack.start_api()
    stack.start_worker("w1")
    try:
        job = stack.submit(
            mlp_job(
                1_000_000,
                max_runtime_s=15,
                checkpoint={"every_steps": 1_000_000, "keep_last": 1},
                max_attempts=3,
            )
        )
        error = _failed_once(stack, job["id"])
        assert error["code"] == "timeout"
        assert "max_runtime_s" in error["message"] and "15 s" in error["message"]
        types = [e["type"] for e in stack.events(job["id"])]
        assert "checkpoint" in types  # stopped at a step boundary, like a cancel
        assert types[-1] == "failed"
    finally:
        stack.close()
