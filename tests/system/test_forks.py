"""Forks through the real service (API with its recorder, one worker, tiny mlp jobs on the
CPU in fp32, which is bitwise): a fork starts from its parent's checkpoint exactly, trains
its own steps only, and releases the pin it held on the parent's checkpoint."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from amptrain.contract.layout import checkpoint_name
from tests.client.test_client_cli import amptrain
from tests.support.specs import service_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def weights_at(stack: Stack, job_id: str, step: int) -> dict[str, torch.Tensor]:
    r = stack.client.get(f"/jobs/{job_id}/checkpoints/{step}", params={"format": "safetensors"})
    assert r.status_code == 200, r.text
    return safetensors.torch.load(r.content)


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def test_a_fork_starts_from_its_parents_checkpoint_bitwise(stack: Stack) -> None:
    c = stack.client
    spec = service_job(max_steps=12, checkpoint={"every_steps": 4, "keep_last": 10})
    parent = stack.submit(spec)["id"]
    stack.wait_for_status(parent, "succeeded")
    parent_points = {p["step"]: p for p in stack.recorded_history(parent, 12)}

    same = c.post(f"/jobs/{parent}/fork", json={"step": 4})
    half = c.post(
        f"/jobs/{parent}/fork",
        json={"step": 4, "overrides": {"optimizer": {"lr": 5e-4}, "max_steps": 8}},
    )
    assert same.status_code == 201 and half.status_code == 201, same.text + half.text
    same_id, half_id = same.json()["id"], half.json()["id"]
    for child in (same_id, half_id):
        stack.wait_for_status(child, "succeeded")

    # No overrides: the parent's steps 5..12 again, bit for bit, and its final weights.
    same_points = stack.recorded_history(same_id, 8)
    assert [p["step"] for p in same_points] == list(range(5, 13))
    for point in same_points:
        assert point["loss"] == parent_points[point["step"]]["loss"], point["step"]
    assert_bitwise(weights_at(stack, same_id, 12), weights_at(stack, parent, 12))

    # A new lr: it starts from the parent's weights at step 4 exactly (its own first
    # checkpoint is that state, written before its first step), and trains at its own lr.
    assert_bitwise(weights_at(stack, half_id, 4), weights_at(stack, parent, 4))
    half_points = stack.recorded_history(half_id, 4)
    assert [p["step"] for p in half_points] == [5, 6, 7, 8]
    assert half_points[0]["loss"] == parent_points[5]["loss"]  # same weights, same batch
    assert half_points[0]["lr"] != parent_points[5]["lr"]
    assert half_points[1]["loss"] != parent_points[6]["loss"]
    (forked,) = [e for e in stack.events(half_id) if e["type"] == "forked"]
    assert forked["step"] == 4
    assert forked["data"] == {"from_job": parent, "from_step": 4, "optimizer": "kept"}

    # Lineage both ways; every pin released once the forks held their own copies.
    assert c.get(f"/jobs/{half_id}").json()["forked_from"] == {"job": parent, "step": 4}
    listed = c.get(f"/jobs/{parent}").json()["forks"]["items"]
    assert {f["id"] for f in listed} == {same_id, half_id}
    directory = stack.root / "checkpoints" / parent
    assert not list(directory.glob("*.pin-*"))
    assert (directory / checkpoint_name(4)).exists()

    the_command_line_forks_and_shows_lineage(stack, parent)


def the_command_line_forks_and_shows_lineage(stack: Stack, parent: str) -> None:
    """``amptrain fork`` (in the same test: one stack)."""
    sets = ("--set", "optimizer.lr=0.0005", "--set", "max_steps=100000")  # cancelled unfinished
    done = amptrain(stack, "fork", parent[:10], "--step", "8", *sets)
    assert done.returncode == 0, done.stderr
    child = stack.job(done.stdout.strip())
    stack.client.post(f"/jobs/{child['id']}/cancel")
    assert child["forked_from"] == {"job": parent, "step": 8}
    assert child["spec"]["optimizer"]["lr"] == 0.0005
    assert f"⑂ {parent[:11]}@8" in amptrain(stack, "jobs").stdout
    watched = amptrain(stack, "watch", child["id"])
    assert watched.returncode == 1 and f"⑂ {parent[:11]}@8" in watched.stderr, watched.stderr
    refused = amptrain(stack, "fork", parent, "--step", "5", "--set", "model.name=cnn")
    assert refused.returncode == 2 and "overrides.model" in refused.stderr, refused.stderr
    missing = amptrain(stack, "fork", parent, "--step", "5")
    assert missing.returncode == 2 and "forkable steps: 4, 8, 12" in missing.stderr
