"""GET /jobs/{id}/metrics with max_points, from_step/to_step and marks, and GET
/jobs/{id}/evals with max_points and from_step/to_step, over real HTTP on SQLite and
PostgreSQL, with points and evaluations recorded by the real recorder; and the parameters
as the OpenAPI schema documents them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from amptrain.contract.records import evaluation
from amptrain.core.settings import Settings
from amptrain.server.web.app import create_app
from tests.server.web.ab_runs import spec
from tests.support.producer import Producer
from tests.support.stack import Stack, wait_until


def recorded(stack: Stack, steps: int, nan_at: int) -> str:
    job = stack.submit(spec(name="nan", max_steps=steps))
    feed = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job["id"])
    try:
        feed.start()
        feed.sink.write(  # type: ignore[union-attr]
            [
                {
                    "kind": "metric",
                    "step": i,
                    "time": 1000.0 + i,
                    "loss": math.nan if i == nan_at else 1 / i,
                    "loss_scale": 65536.0,
                    "skipped": i == nan_at,
                    "grad_norm": None if i == nan_at else 1.0,
                    "lr": 1e-3,
                    "memory_allocated": None,
                    "memory_reserved": None,
                    "memory_peak": None,
                    "samples_per_second": 100.0,
                    "step_time_ms": 1.0,
                    "skipped_steps": int(i >= nan_at),
                }
                for i in range(1, steps + 1)
            ]
        )
        assert feed.sink is not None and feed.sink.flush()
    finally:
        feed.close()
    wait_until(lambda: stack.job(job["id"])["step"] == steps, 30, f"{steps} points recorded")
    return str(job["id"])


def refused(c: Any, url: str, params: dict[str, Any]) -> str:
    """The one field a 422 names."""
    r = c.get(url, params=params)
    assert r.status_code == 422, r.text
    (p,) = r.json()["detail"]
    return str(p["field"])


def test_window_marks_and_validation(api_stack: Stack) -> None:
    c = api_stack.client
    job_id = recorded(api_stack, 2_000, nan_at=1_234)
    url = f"/jobs/{job_id}/metrics"

    whole = c.get(url, params={"max_points": 60, "fields": "loss,skipped"}).json()
    assert len(whole["items"]) <= 60
    nan = [p for p in whole["items"] if p["step"] == 1_234]
    assert nan == [
        {
            "step": 1_234,
            "loss": None,
            "skipped": True,
            "attempt": 1,
            "cursor": nan[0]["cursor"],
            "downsampled": True,
            "bucket_last": False,
        }
    ]
    (mark,) = whole["marks"]
    assert mark["from_step"] <= 1_234 <= mark["to_step"]
    assert (mark["flagged"], mark["skipped"], mark["non_finite"]) == (1, 1, 1)

    zoom = c.get(url, params={"max_points": 500, "from_step": 1_200, "to_step": 1_300}).json()
    assert [p["step"] for p in zoom["items"]] == list(range(1_200, 1_301))
    assert zoom["marks"] == [] and not any(p["downsampled"] for p in zoom["items"])
    assert zoom["next_cursor"] == whole["next_cursor"]

    def problem(params: dict[str, Any]) -> str:
        return refused(c, url, params)

    assert problem({"max_points": 10, "from_step": 9, "to_step": 3}) == "query.to_step"
    assert problem({"from_step": 3}) == "query.from_step"
    assert problem({"to_step": 3}) == "query.to_step"
    assert problem({"max_points": 10, "from_step": -1}) == "query.from_step"


def test_eval_window_keeps_the_spike_and_validates_like_metrics(api_stack: Stack) -> None:
    c = api_stack.client
    job = api_stack.submit(spec(name="evals", max_steps=2_000))
    feed = Producer(
        api_stack.env["AMPTRAIN_REDIS_URL"], api_stack.env["AMPTRAIN_DATABASE_URL"], job["id"]
    )
    spike = 730
    try:
        feed.start()
        feed.sink.write(  # type: ignore[union-attr]
            [
                evaluation(
                    step,
                    1000.0 + step,
                    {"eval_loss": 1 / step, "accuracy": 0.99 if step == spike else step / 4000},
                )
                for step in range(10, 2_001, 10)
            ]
        )
        assert feed.sink is not None and feed.sink.flush()
    finally:
        feed.close()
    url = f"/jobs/{job['id']}/evals"

    def full() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = c.get(url, params={"limit": 10_000}).json()["items"]
        return items if len(items) == 200 else []

    series = wait_until(full, 30, "200 evaluations recorded")
    coarse = c.get(url, params={"max_points": 30}).json()
    assert 2 < len(coarse["items"]) <= 30 and all(e["downsampled"] for e in coarse["items"])
    steps = [e["step"] for e in coarse["items"]]
    assert {10, spike, 2_000} <= set(steps) and steps == sorted(steps)
    assert coarse["next_cursor"] == series[-1]["cursor"]
    whole = c.get(url, params={"max_points": 200}).json()["items"]
    assert whole == [{**e, "downsampled": False} for e in series]
    zoom = c.get(url, params={"max_points": 100, "from_step": 500, "to_step": 800}).json()
    assert [e["step"] for e in zoom["items"]] == list(range(500, 801, 10))
    assert "downsampled" not in series[0]  # cursor pages stay as they were

    def problem(params: dict[str, Any]) -> str:
        return refused(c, url, params)

    assert problem({"max_points": 10, "from_step": 9, "to_step": 3}) == "query.to_step"
    assert problem({"max_points": 10, "after": series[0]["cursor"]}) == "query.after"
    assert problem({"from_step": 3}) == "query.from_step"
    assert problem({"max_points": 0}) == "query.max_points"


def test_openapi_documents_the_window(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)  # the schema needs no running service
    schema = create_app(settings).openapi()
    op = schema["paths"]["/jobs/{job_id}/metrics"]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert {"max_points", "fields", "from_step", "to_step"} <= set(params)
    assert "full resolution" in params["from_step"]["description"]
    assert "grad_norm" in params["max_points"]["description"]
    evals = {p["name"]: p for p in schema["paths"]["/jobs/{job_id}/evals"]["get"]["parameters"]}
    assert {"max_points", "from_step", "to_step", "after", "limit", "attempts"} <= set(evals)
    assert "min and its max" in evals["max_points"]["description"]
    page = schema["components"]["schemas"]["MetricPage"]
    assert "marks" in page["properties"]
    assert {"from_step", "to_step", "skipped", "non_finite"} <= set(
        schema["components"]["schemas"]["BucketMark"]["properties"]
    )
    assert "/comparisons" in schema["paths"] and "/comparisons/{comparison_id}" in schema["paths"]
    assert not any(p.startswith("/ui") for p in schema["paths"])
