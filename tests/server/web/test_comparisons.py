"""POST/GET /comparisons against a real uvicorn, Redis and database (SQLite and, when
configured, PostgreSQL): one job per precision, and a report whose numbers come from the
points the recorder stored."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from amptrain.contract.admission import WorkerMemory
from amptrain.contract.spec import JobSpec
from amptrain.core import presence
from amptrain.server.web.routes.comparisons import MAX_RUNS, _wants_tf32
from tests.server.web.ab_runs import EVALS, RUNS, STEPS, play, spec
from tests.server.web.test_submit_memory import announce
from tests.support.stack import Stack, user_client, wait_until


def test_a_b_report_from_recorded_points(api_stack: Stack) -> None:
    c = api_stack.client
    created = c.post("/comparisons", json={"spec": spec(), "precisions": ["fp32", "bf16", "fp16"]})
    assert created.status_code == 201, created.text
    report = created.json()
    assert report["baseline"] == "fp32" and report["name"] == "ab"
    runs = {r["precision"]: r for r in report["runs"]}
    assert list(runs) == ["fp32", "bf16", "fp16"]
    for precision, run in runs.items():
        job = api_stack.job(run["job_id"])
        assert job["spec"]["precision"] == precision and job["status"] == "queued"
        assert job["name"] == f"ab [{precision}]"
        assert run["throughput"] is None and run["ratios"]["throughput"] is None

    assert {r["verdict"]["kept_accuracy"] for r in runs.values()} == {True, None}
    for precision, values in RUNS.items():
        play(api_stack, runs[precision]["job_id"], values, EVALS[precision], precision)

    def finished() -> dict[str, Any] | None:
        r = c.get(f"/comparisons/{report['id']}").json()
        done = all(run["status"] == "succeeded" and run["step"] == STEPS for run in r["runs"])
        # Succeeded is written before the recorder has the last points: until the final
        # evaluation is in, the verdict waits (and says so).
        if done and any(run["eval_pending"] for run in r["runs"]):
            base_pending = r["runs"][0]["eval_pending"]
            for run in r["runs"][1:]:
                if base_pending or run["eval_pending"]:
                    assert run["verdict"]["kept_accuracy"] is None, run
            return None
        return r if done else None

    final = wait_until(finished, 30, "the three runs to be recorded")
    runs = {r["precision"]: r for r in final["runs"]}
    # The warm-up's 1 samples/s is left out of the steady state; the last 10 steps' loss is the final loss.
    assert runs["fp32"]["throughput"] == pytest.approx(100.0)
    assert runs["bf16"]["ratios"]["throughput"] == pytest.approx(2.5)
    assert runs["fp16"]["ratios"]["throughput"] == pytest.approx(2.0)
    assert runs["fp32"]["peak_memory"] == 4000
    assert runs["bf16"]["ratios"]["peak_memory"] == pytest.approx(0.5)
    assert runs["fp16"]["ratios"]["peak_memory"] == pytest.approx(0.6)
    assert runs["fp16"]["final_loss"] == pytest.approx(0.55)
    assert runs["fp16"]["ratios"]["final_loss"] == pytest.approx(1.1)
    assert runs["fp32"]["ratios"] == {"throughput": 1.0, "peak_memory": 1.0, "final_loss": 1.0}
    # One steady-state samples/s: the comparison, the job list and the job's summary agree.
    listed = {j["id"]: j for j in c.get("/jobs", params={"limit": 10}).json()["items"]}
    for run in runs.values():
        summary = api_stack.job(run["job_id"])["summary"]
        assert summary["samples_per_second"] == pytest.approx(run["throughput"])
        assert (
            listed[run["job_id"]]["summary"]["samples_per_second"] == summary["samples_per_second"]
        )
    # Each run's precisions over its steps (more than one after a health.fallback).
    for precision, run in runs.items():
        assert [(h["precision"], h["from_step"]) for h in run["precision_history"]] == [
            (precision, 0)
        ]
    curves = final["loss_curves"]
    assert curves["step"] == list(range(1, STEPS + 1))
    assert set(curves["loss"]) == {"fp32", "bf16", "fp16"}
    assert curves["loss"]["bf16"][-1] == pytest.approx(0.51)
    assert all(len(v) == STEPS for v in curves["loss"].values())
    # The accuracy verdict, from each run's final evaluation against fp32's.
    assert final["tolerance"] == {"accuracy_points": 0.5, "eval_loss_relative": 0.02}
    assert runs["bf16"]["eval_step"] == STEPS and runs["bf16"]["eval"] == EVALS["bf16"]
    assert runs["bf16"]["eval_diff"] == {
        "accuracy_points": pytest.approx(-0.2),
        "eval_loss_relative": pytest.approx(0.01),
    }
    assert runs["fp32"]["verdict"]["kept_accuracy"] is True
    assert runs["bf16"]["verdict"]["kept_accuracy"] is True
    fp16 = runs["fp16"]["verdict"]
    assert fp16["kept_accuracy"] is False and len(fp16["reasons"]) == 2
    assert "-1.50 points" in fp16["reasons"][0] and "beyond" in fp16["reasons"][0]
    loose = {"accuracy_points": 2, "eval_loss_relative": 0.2}
    relaxed = c.get(f"/comparisons/{report['id']}", params=loose).json()
    assert [r["verdict"]["kept_accuracy"] for r in relaxed["runs"]] == [True, True, True]
    bad = c.get(
        f"/comparisons/{report['id']}", params={"accuracy_points": -1, "eval_loss_relative": 11}
    )
    assert bad.status_code == 422
    assert {p["field"] for p in bad.json()["detail"]} == {
        "query.accuracy_points",
        "query.eval_loss_relative",
    }
    listed = c.get("/comparisons").json()["items"]
    assert [x["id"] for x in listed] == [report["id"]]


def test_bad_requests_name_the_field_and_create_nothing(api_stack: Stack) -> None:
    c = api_stack.client

    def problems(body: dict[str, Any]) -> set[str]:
        r = c.post("/comparisons", json=body)
        assert r.status_code == 422, r.text
        return {p["field"] for p in r.json()["detail"]}

    assert problems({"spec": spec(), "precisions": ["fp32", "fp32"]}) == {"precisions"}
    assert problems({"spec": spec(), "precisions": ["fp32", "fp8"]}) == {"precisions.1"}
    assert problems({"spec": spec(), "precisions": ["fp32"]}) == {"precisions"}
    assert problems({"spec": spec(max_steps=0), "precisions": ["fp32", "bf16"]}) == {
        "spec.max_steps"
    }
    unknown = spec(model={"name": "no-such-model"})
    assert problems({"spec": unknown, "precisions": ["fp32", "bf16"]}) == {"spec.model.name"}
    assert problems({"spec": spec(queue="nope"), "precisions": ["fp32", "bf16"]}) == {"spec.queue"}
    for bad in ("ab\x1b[2J", "ab\u202etxt.exe", "line\nbreak"):
        r = c.post(
            "/comparisons", json={"spec": spec(), "precisions": ["fp32", "bf16"], "name": bad}
        )
        assert r.status_code == 422, r.text
        (problem,) = r.json()["detail"]
        assert problem["field"] == "name"
        assert "control or formatting characters" in problem["message"]
    assert c.get("/comparisons").json()["items"] == []
    assert c.get("/jobs").json()["items"] == []


def test_only_the_owner_sees_a_comparison(api_stack: Stack) -> None:
    with user_client(api_stack, "alice") as alice, user_client(api_stack, "bob") as bob:
        made = alice.post("/comparisons", json={"spec": spec(), "precisions": ["fp32", "bf16"]})
        assert made.status_code == 201, made.text
        cid = made.json()["id"]
        assert bob.get(f"/comparisons/{cid}").status_code == 404
        assert bob.get("/comparisons").json()["items"] == []
        assert alice.get(f"/comparisons/{cid}").status_code == 200
        jobs = alice.get("/jobs").json()["items"]
        assert {j["owner"] for j in jobs} == {"alice"} and len(jobs) == 2
    # The admin sees everyone's.
    assert api_stack.client.get(f"/comparisons/{cid}").status_code == 200
    assert api_stack.client.get("/comparisons/c_nope").status_code == 404


def test_a_tf32_run_is_added_on_gpu_workers(api_stack: Stack) -> None:
    c = api_stack.client

    def arms(precisions: list[str], **overrides: Any) -> tuple[list[str], str | None]:
        body = {"spec": spec(**{"device": "auto", **overrides}), "precisions": precisions}
        r = c.post("/comparisons", json=body)
        assert r.status_code == 201, r.text
        return [run["precision"] for run in r.json()["runs"]], r.json()["notice"]

    # No live worker of the queue, then a CPU-only one: the runs asked for, no notice.
    assert arms(["fp32", "bf16"]) == (["fp32", "bf16"], None)
    announce(api_stack, "cpu@test", available=16, queues=["gpu-a100"], gpu=False)
    assert arms(["fp32", "bf16"]) == (["fp32", "bf16"], None)

    # GPU workers only (the worker's own presence record): tf32, the fair speed baseline.
    with redis.Redis.from_url(api_stack.env["AMPTRAIN_REDIS_URL"]) as client:
        presence.remove_worker(client, "cpu@test")
    announce(api_stack, "a100@test", available=16, queues=["gpu-a100"], gpu=True)
    r = c.post("/comparisons", json={"spec": spec(device="auto"), "precisions": ["fp32", "bf16"]})
    assert r.status_code == 201, r.text
    made = r.json()
    assert [run["precision"] for run in made["runs"]] == ["fp32", "bf16", "tf32"]
    assert "added a tf32 run" in made["notice"] and "gpu-a100" in made["notice"]
    tf32 = api_stack.job(made["runs"][2]["job_id"])
    assert tf32["spec"]["precision"] == "tf32" and tf32["name"] == "ab [tf32]"
    read = c.get(f"/comparisons/{made['id']}").json()
    assert [run["precision"] for run in read["runs"]] == ["fp32", "bf16", "tf32"]
    assert read["notice"] is None and read["baseline"] == "fp32"

    # Nothing added when tf32 is asked already, without fp32, with no room left (the
    # request's own limit), or for a job that trains on the CPU.
    assert arms(["bf16", "tf32", "fp32"]) == (["bf16", "tf32", "fp32"], None)
    assert arms(["bf16", "fp16"]) == (["bf16", "fp16"], None)
    full = ["fp32", "bf16", "fp16", "auto"][:MAX_RUNS]
    assert arms(full) == (full, None)
    assert arms(["fp32", "bf16"], device="cpu") == (["fp32", "bf16"], None)
    # Nor when the request lists its arms exactly (the dashboard's form offers tf32 itself).
    optout = {"spec": spec(device="auto"), "precisions": ["fp32", "bf16"], "add_tf32": False}
    assert [r["precision"] for r in c.post("/comparisons", json=optout).json()["runs"]] == [
        "fp32",
        "bf16",
    ]

    # A CPU worker among them may take any run: then tf32 could not be what it says.
    announce(api_stack, "cpu@test", available=16, queues=["gpu-a100"], gpu=False)
    assert arms(["fp32", "bf16"]) == (["fp32", "bf16"], None)


def test_no_tf32_run_when_the_workers_are_unknown() -> None:
    # Redis did not answer (queue_workers gave None): nothing is known, nothing is added.
    job = JobSpec.model_validate(spec(device="auto"))
    assert _wants_tf32(job, ["fp32", "bf16"], None) is False
    assert _wants_tf32(job, ["fp32", "bf16"], []) is False
    assert _wants_tf32(job, ["fp32", "bf16"], [WorkerMemory(2**30, gpu=True)]) is True
