"""The HTTP contract against a real uvicorn process, real Redis and a real database."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.cursor import Cursor
from amptrain.contract.metrics import METRIC_FIELDS
from amptrain.contract.records import evaluation, metric
from amptrain.contract.stream import encode
from amptrain.core.redis import Keys
from amptrain.store import jobs
from amptrain.store.db import make_engine, make_session_factory
from tests.support.specs import mlp_job
from tests.support.stack import Stack, user_client, wait_until

ROOT = Path(__file__).resolve().parents[3]


def cpu_job(**overrides: Any) -> dict[str, Any]:
    return mlp_job(**{"name": "tiny", "max_steps": 5, **overrides})


def anonymous(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=str(stack.client.base_url), timeout=30)


def fields(response: httpx.Response) -> set[str]:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "validation_error"
    return {p["field"] for p in body["detail"]}


def test_health_is_open_everything_else_needs_a_token(api_stack: Stack) -> None:
    with anonymous(api_stack) as anon:
        assert anon.get("/healthz").json() == {"status": "ok"}
        ready = anon.get("/readyz")
        assert ready.status_code == 200 and ready.json()["database"] == "ok", ready.text
        for method, path in [
            ("GET", "/jobs"),
            ("POST", "/jobs"),
            ("GET", "/jobs/j_x"),
            ("POST", "/jobs/j_x/cancel"),
            ("GET", "/jobs/j_x/metrics"),
            ("GET", "/jobs/j_x/events"),
            ("GET", "/catalog"),
        ]:
            r = anon.request(method, path, json=cpu_job() if method == "POST" else None)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
        bad = anon.get("/jobs", headers={"Authorization": "Bearer not-a-token"})
        assert bad.status_code == 401
    catalog = api_stack.client.get("/catalog").json()
    assert "mlp" in catalog["models"] and "fp16" in catalog["precisions"]
    missing = api_stack.client.get("/no-such-route")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_422_names_each_bad_field(api_stack: Stack) -> None:
    c = api_stack.client
    assert fields(c.post("/jobs", json=cpu_job(precision="fp8"))) == {"precision"}
    spec = cpu_job(max_step=5)
    del spec["max_steps"]
    assert fields(c.post("/jobs", json=spec)) == {"max_step", "max_steps"}
    assert fields(c.post("/jobs", json=cpu_job(optimizer={"lr": -1}))) == {"optimizer.lr"}
    for wrong in ("yes", 1, "true"):  # a bitwise promise takes a JSON bool only
        assert fields(c.post("/jobs", json=cpu_job(deterministic=wrong))) == {"deterministic"}
    unknown = cpu_job(
        model={"name": "no-such-model"},
        dataset={"name": "synthetic-classification", "args": {"bogus": 1}},
    )
    assert fields(c.post("/jobs", json=unknown)) == {"model.name", "dataset.args.bogus"}
    assert fields(c.get("/jobs", params={"limit": 0})) == {"query.limit"}
    for wrong in ("sleeping", "", "queued,", " queued"):  # only the documented pattern
        assert fields(c.get("/jobs", params={"status": wrong})) == {"query.status"}, wrong
    assert fields(c.get("/jobs", params={"cursor": "garbage!"})) == {"query.cursor"}
    for wrong in ("j_", "j_G", "j_%", "x" * 40):  # a prefix is j_ and hex digits
        assert fields(c.get("/jobs", params={"id_prefix": wrong})) == {"query.id_prefix"}
    # A transformer whose heads do not divide its width: was a 201 that failed on the worker.
    heads = cpu_job(
        model={"name": "transformer", "args": {"d_model": 130, "n_heads": 4}},
        dataset={"name": "synthetic-text"},
    )
    assert fields(c.post("/jobs", json=heads)) == {"model.args.n_heads"}
    # An evaluation metric the dataset's task cannot give: was dropped silently on the worker.
    lm = cpu_job(model={"name": "transformer"}, dataset={"name": "synthetic-text"})
    wrong = c.post("/jobs", json={**lm, "eval": {"metrics": ["perplexity", "accuracy"]}})
    assert fields(wrong) == {"eval.metrics"}
    assert wrong.json()["detail"][0]["message"].startswith("accuracy: not computed for a language")
    assert fields(c.post("/jobs", json=cpu_job(eval={"metrics": ["f1_macro"] * 65}))) == {
        "eval.metrics"
    }
    assert c.get("/jobs").json()["items"] == []  # nothing was created by the bad requests


def test_the_schema_says_what_is_accepted(api_stack: Stack) -> None:
    """The statuses a listing filters by, this service's queues (AMPTRAIN_QUEUES of the
    stack: gpu, cpu, gpu-a100, and their shape queues) and the batch rules."""
    schema = api_stack.client.get("/openapi.json").json()
    (status,) = [p for p in schema["paths"]["/jobs"]["get"]["parameters"] if p["name"] == "status"]
    pattern = status["schema"]["pattern"]  # on the string-or-null: strings only
    for value in ("queued", "running,succeeded", "cancelling,failed,cancelled"):
        assert re.fullmatch(pattern, value), value
    assert not re.fullmatch(pattern, "sleeping") and "queued, running" in status["description"]
    spec = schema["components"]["schemas"]["JobSpec"]["properties"]
    queues = spec["queue"]["anyOf"][0]["enum"]
    assert {"gpu", "cpu", "gpu-a100", "gpu-x2", "cpu-x8"} <= set(queues)
    assert "divisible by ``grad_accum_steps`` x ``devices``" in spec["batch_size"]["description"]
    assert (
        "n_heads`` divides its ``d_model``"
        in schema["components"]["schemas"]["JobSpec"]["description"]
    )


def test_submit_read_and_idempotency(api_stack: Stack) -> None:
    c = api_stack.client
    first = c.post("/jobs", json=cpu_job(), headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201, first.text
    job = first.json()
    assert job["status"] == "queued" and job["id"].startswith("j_")
    assert job["attempt"] == 0 and job["step"] == 0 and job["max_steps"] == 5
    assert job["precision"] == {"requested": "auto", "effective": None, "reason": None}
    assert job["error"] is None
    # No worker runs beside this API: the submitter is told the job will wait, and why.
    assert "no live worker takes jobs of queue cpu" in job["notice"]
    assert job["summary"] == {
        **dict.fromkeys(
            ["loss", "loss_scale", "skipped_steps", "memory_peak", "samples_per_second", "eval"]
        ),
        "overflow_counts": {},
    }
    assert job["spec"]["model"] == {"name": "mlp", "args": {}}
    # The notice is the submit's only; the precision history GET /jobs/{id}'s.
    assert c.get(f"/jobs/{job['id']}").json() == {
        **job,
        "notice": None,
        "precision_history": [],
        "forks": {"items": [], "more": False},
    }

    again = c.post("/jobs", json=cpu_job(), headers={"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == job["id"]
    other = c.post("/jobs", json=cpu_job(max_steps=6), headers={"Idempotency-Key": "k1"})
    assert other.status_code == 409 and other.json()["error"] == "conflict"
    # Without a key every POST is a new job; the same key of another user is another job.
    assert c.post("/jobs", json=cpu_job()).json()["id"] != job["id"]
    with user_client(api_stack, "alice") as alice:
        theirs = alice.post("/jobs", json=cpu_job(), headers={"Idempotency-Key": "k1"})
        assert theirs.status_code == 201 and theirs.json()["id"] != job["id"]

    # This stack runs no worker: once sent, the job says it waits for one (once).
    def events_after_the_send() -> dict[str, Any] | None:
        page: dict[str, Any] = c.get(f"/jobs/{job['id']}/events").json()
        return page if len(page["items"]) > 1 else None

    events = wait_until(events_after_the_send, 30, "the waiting_for_queue event")
    assert [e["type"] for e in events["items"]] == ["queued", "waiting_for_queue"]
    assert events["items"][1]["data"]["queue"] == "cpu"
    assert (
        c.get(f"/jobs/{job['id']}/events", params={"after": events["next_cursor"]}).json()["items"]
        == []
    )


def test_list_pages_newest_first_and_owners_see_only_their_jobs(api_stack: Stack) -> None:
    with user_client(api_stack, "alice") as alice, user_client(api_stack, "bob") as bob:
        mine = [alice.post("/jobs", json=cpu_job(name=f"a{i}")).json()["id"] for i in range(5)]
        bobs = bob.post("/jobs", json=cpu_job(name="b")).json()["id"]
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = alice.get("/jobs", params=params).json()
            seen += [j["id"] for j in page["items"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == mine[::-1] and pages == 3
        # Foreign jobs are invisible, not forbidden: 404 everywhere.
        for path in (f"/jobs/{bobs}", f"/jobs/{bobs}/events", f"/jobs/{bobs}/metrics"):
            assert alice.get(path).status_code == 404
        assert alice.post(f"/jobs/{bobs}/cancel").status_code == 404
        alice.post(f"/jobs/{mine[0]}/cancel")
        cancelled = alice.get("/jobs", params={"status": "cancelled"}).json()["items"]
        assert [j["id"] for j in cancelled] == [mine[0]]
        both = alice.get("/jobs", params={"status": "queued,cancelled"}).json()["items"]
        assert len(both) == 5
    admin_view = [
        j["id"] for j in api_stack.client.get("/jobs", params={"limit": 200}).json()["items"]
    ]
    assert admin_view == [bobs, *mine[::-1]]


def test_cancel_queued_then_running(api_stack: Stack, redis_server: EmbeddedRedis) -> None:
    c = api_stack.client
    queued = c.post("/jobs", json=cpu_job()).json()
    r = c.post(f"/jobs/{queued['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    assert r.json()["finished_at"] is not None
    again = c.post(f"/jobs/{queued['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    types = [e["type"] for e in c.get(f"/jobs/{queued['id']}/events").json()["items"]]
    # Whether the dispatcher's waiting_for_queue note (no worker here) came before the
    # cancel is timing; after the cancel it never comes.
    assert [t for t in types if t != "waiting_for_queue"] == ["queued", "cancelled"]

    running = c.post("/jobs", json=cpu_job()).json()
    engine = make_engine(api_stack.env["AMPTRAIN_DATABASE_URL"])
    with make_session_factory(engine)() as s:
        assert jobs.claim(s, running["id"], "test-worker", 30) == 1
        s.commit()
    engine.dispose()
    r = c.post(f"/jobs/{running['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelling"
    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    assert client.get(Keys.cancel(running["id"])) is not None
    assert c.post(f"/jobs/{running['id']}/cancel").status_code == 202  # still cancelling
    assert c.post("/jobs/j_nope/cancel").status_code == 404


def test_api_app_never_imports_torch() -> None:
    code = "import sys, amptrain.server.web.app, amptrain.cli.server, amptrain.server.dispatcher; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_metrics_page_through_recorded_points_once(
    api_stack: Stack, redis_server: EmbeddedRedis
) -> None:
    c = api_stack.client
    job = c.post("/jobs", json=cpu_job(max_steps=25)).json()
    engine = make_engine(api_stack.env["AMPTRAIN_DATABASE_URL"])
    with make_session_factory(engine)() as s:
        attempt = jobs.claim(s, job["id"], "test-worker", 30)
        s.commit()
    engine.dispose()
    assert attempt == 1
    # Publish the way a training child does: one stream entry per step.
    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    for step in range(1, 26):
        record = metric(
            step=step, time=1000.0 + step, loss=1.0 / step, skipped=False, skipped_steps=0
        )
        fields_ = encode(record, job_id=job["id"], attempt=1)
        client.xadd(Keys.telemetry(job["id"]), dict(fields_))  # type: ignore[arg-type]
        if step % 10 == 0:  # an evaluation every 10 steps, between the points
            ev = evaluation(step, 1000.0 + step, {"eval_loss": 1.0 / step, "accuracy": 0.09 * step})
            fields_ = encode(ev, job_id=job["id"], attempt=1)
            client.xadd(Keys.telemetry(job["id"]), dict(fields_))  # type: ignore[arg-type]

    def all_points() -> list[dict[str, Any]]:
        pts = api_stack.all_metrics(job["id"], limit=7)
        return pts if len(pts) >= 25 else []

    points = wait_until(all_points, 20, "25 points")
    assert [p["step"] for p in points] == list(range(1, 26))
    assert set(METRIC_FIELDS) | {"attempt", "cursor"} <= set(points[12])
    last = c.get(f"/jobs/{job['id']}/metrics", params={"after": points[-1]["cursor"]}).json()
    assert last == {"items": [], "next_cursor": points[-1]["cursor"]}
    middle = c.get(f"/jobs/{job['id']}/metrics", params={"after": points[9]["cursor"], "limit": 3})
    assert [p["step"] for p in middle.json()["items"]] == [11, 12, 13]
    assert fields(c.get(f"/jobs/{job['id']}/metrics", params={"after": "nope"})) == {"query.after"}
    current = wait_until(
        lambda: (j := c.get(f"/jobs/{job['id']}").json())["step"] == 25 and j, 10, "step"
    )
    assert current["summary"]["loss"] == pytest.approx(1.0 / 25)
    assert current["summary"]["eval"] == {
        "step": 20,
        "attempt": 1,
        "values": {"accuracy": pytest.approx(1.8), "eval_loss": 0.05},
    }

    # The evaluations, one per page, by the same cursor (between the points' cursors).
    first = c.get(f"/jobs/{job['id']}/evals", params={"limit": 1}).json()
    second = c.get(f"/jobs/{job['id']}/evals", params={"after": first["next_cursor"]}).json()
    assert [(e["step"], e["values"]["eval_loss"]) for e in first["items"] + second["items"]] == [
        (10, 0.1),
        (20, 0.05),
    ]
    at = Cursor.parse(first["items"][0]["cursor"])
    assert Cursor.parse(points[9]["cursor"]) < at < Cursor.parse(points[10]["cursor"])
    assert second["next_cursor"] == second["items"][-1]["cursor"]
    bad = {"after": "1-x", "limit": 0, "attempts": "some"}
    assert fields(c.get(f"/jobs/{job['id']}/evals", params=bad)) == {
        "query.limit",
        "query.attempts",
    }
    assert fields(c.get(f"/jobs/{job['id']}/evals", params={"after": "1-x"})) == {"query.after"}
