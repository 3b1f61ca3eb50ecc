"""``POST /jobs/{id}/fork`` through the real API (no worker: forks stay queued): validation
naming each field, the forkable steps listed, owner scoping, lineage both ways, and the pin
a fork puts beside its checkpoint (released when it is cancelled while queued)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from amptrain.contract.layout import checkpoint_name, pin_name
from tests.support.specs import service_job
from tests.support.stack import Stack, user_client


def checkpoints(stack: Stack, job_id: str, *steps: int) -> Path:
    """Checkpoint files as the API lists them (their contents are the worker's business)."""
    directory = Path(stack.env["AMPTRAIN_CHECKPOINT_URL"]) / job_id
    directory.mkdir(parents=True)
    for step in steps:
        (directory / checkpoint_name(step)).write_bytes(b"x")
    return directory


def problems(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    return [p["field"] for p in response.json()["detail"]]


def test_fork_validation_lineage_and_pins(api_stack: Stack) -> None:
    alice = user_client(api_stack, "alice")
    r = alice.post("/jobs", json=service_job(max_steps=30))
    assert r.status_code == 201, r.text
    parent = r.json()["id"]
    directory = checkpoints(api_stack, parent, 10, 20)

    def fork(body: dict[str, Any], client: httpx.Client = alice) -> httpx.Response:
        return client.post(f"/jobs/{parent}/fork", json=body)

    # The field each refusal names.
    assert problems(fork({"step": 10, "overrides": {"model": {"name": "mlp"}}})) == [
        "overrides.model"
    ]
    assert problems(fork({"step": 10, "overrides": {"batch_size": 64}})) == ["overrides.batch_size"]
    assert problems(fork({"step": 10, "overrides": {"nope": 1}})) == ["overrides.nope"]
    assert problems(fork({"step": 10, "overrides": {"max_steps": 10}})) == ["overrides.max_steps"]
    assert problems(fork({"step": 10, "overrides": {"optimizer": {"lr": 0}}})) == [
        "overrides.optimizer.lr"
    ]
    assert problems(fork({"step": -1})) == ["step"]
    assert problems(fork({"step": 10**15})) == ["step"]
    assert problems(fork({"step": "10"})) == ["step"]
    deep = {"health": {"spike": {"a": {"b": {"c": {}}}}}}
    assert problems(fork({"step": 10, "overrides": deep})) == ["overrides"]
    assert problems(fork({"step": 10, "overrides": {"queue": "q" * 20_000}})) == ["overrides"]

    # A step without a checkpoint: the forkable ones listed.
    r = fork({"step": 15})
    assert r.status_code == 409, r.text
    assert r.json()["detail"]["forkable_steps"] == [10, 20]
    assert not list(directory.glob("*.pin-*"))  # the refused fork's pin went with it

    # Another user's job is no job at all.
    assert fork({"step": 10}, user_client(api_stack, "mallory")).status_code == 404

    r = fork({"step": 10, "overrides": {"optimizer": {"lr": 5e-4}}, "name": "half lr"})
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["forked_from"] == {"job": parent, "step": 10}
    assert child["spec"]["optimizer"]["lr"] == 5e-4 and child["name"] == "half lr"
    assert child["status"] == "queued" and child["spec"]["max_steps"] == 30
    assert (directory / pin_name(10, child["id"])).exists()
    listed = alice.get(f"/jobs/{parent}").json()["forks"]
    assert listed == {
        "items": [
            {"id": child["id"], "name": "half lr", "status": "queued", "step": 0, "fork_step": 10}
        ],
        "more": False,
    }
    assert alice.get(f"/jobs/{child['id']}").json()["forked_from"]["step"] == 10

    # Cancelled while queued: it will never need the checkpoint.
    assert alice.post(f"/jobs/{child['id']}/cancel").status_code == 202
    assert not (directory / pin_name(10, child["id"])).exists()

    # The checkpoints gone (pruned, or the job's directory removed): said so.
    for path in directory.iterdir():
        path.unlink()
    r = fork({"step": 10})
    assert r.status_code == 409 and r.json()["detail"]["forkable_steps"] == []
