"""A fork keeps its parent's ``alerts``: rules of its own, scoped to the fork."""

from __future__ import annotations

from tests.server.web.test_forks import checkpoints
from tests.support.specs import service_job
from tests.support.stack import Stack


def test_a_fork_gets_rules_of_its_own(stack: Stack) -> None:
    alert = {"name": "plateau", "when": {"kind": "early_stop", "series": "eval_loss"}}
    parent = stack.submit(service_job(max_steps=30, alerts=[alert]))
    checkpoints(stack, parent["id"], 10)
    r = stack.client.post(f"/jobs/{parent['id']}/fork", json={"step": 10})
    assert r.status_code == 201, r.text
    rules = stack.client.get("/alerts/rules").json()["items"]
    assert sorted((x["name"], x["job_id"]) for x in rules) == sorted(
        [("plateau", parent["id"]), ("plateau", r.json()["id"])]
    )
