"""Fine-tuning round trip through the service (issue 38): job A's final checkpoint, exported
as safetensors into the weights root, starts job B, whose weights before its first optimizer
step are A's final weights bit for bit. Hostile weights paths are 422s at submit or
``invalid_spec`` from the worker, naming ``weights.path``, and nothing is unpickled."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tests.client.test_client_cli import amptrain
from tests.engine.test_initial_weights import _Marker
from tests.server.web.test_http import fields
from tests.support.specs import mlp_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def job(max_steps: int, **extra: Any) -> dict[str, Any]:
    return mlp_job(
        max_steps,
        model={"name": "mlp", "args": {"width": 16}},
        batch_size=16,
        precision="fp32",
        checkpoint={"every_steps": 100, "keep_last": 5},
        **extra,
    )


def weights_at(stack: Stack, job_id: str, step: int) -> dict[str, torch.Tensor]:
    r = stack.client.get(f"/jobs/{job_id}/checkpoints/{step}", params={"format": "safetensors"})
    assert r.status_code == 200, r.text
    return safetensors.torch.load(r.content)


def test_an_exported_checkpoint_starts_the_next_job_bitwise(stack: Stack) -> None:
    c = stack.client
    a = c.post("/jobs", json=job(4, seed=3)).json()["id"]
    stack.wait_for_status(a, "succeeded")
    final = weights_at(stack, a, 4)

    exported = c.post(f"/jobs/{a}/checkpoints/4/export", json={"name": "a-final"})
    assert exported.status_code == 201, exported.text
    assert exported.json()["path"] == "a-final.safetensors"
    again = c.post(f"/jobs/{a}/checkpoints/4/export", json={"name": "a-final.safetensors"})
    assert again.status_code == 409
    assert fields(c.post(f"/jobs/{a}/checkpoints/4/export", json={"name": "../x"})) == {"name"}
    cli = amptrain(stack, "export", a[:8], "by-cli")  # the newest checkpoint's: step 4
    assert cli.stdout.startswith("weights.path: by-cli.safetensors"), cli.stdout + cli.stderr
    assert (stack.root / "weights" / "by-cli.safetensors").read_bytes() == (
        stack.root / "weights" / "a-final.safetensors"
    ).read_bytes()

    b = c.post("/jobs", json=job(2, seed=9, weights={"path": "a-final.safetensors"})).json()
    stack.wait_for_status(b["id"], "succeeded")
    start = weights_at(stack, b["id"], 0)  # before B's first optimizer step
    assert start.keys() == final.keys()
    for name, tensor in final.items():
        assert torch.equal(start[name], tensor) and start[name].dtype == tensor.dtype, name
    (loaded,) = [e for e in stack.events(b["id"]) if e["type"] == "weights"]
    assert loaded["data"]["loaded"] == len(final)
    hostile_weights_paths_are_refused_naming_the_field(stack, stack.root)


def hostile_weights_paths_are_refused_naming_the_field(stack: Stack, tmp_path: Path) -> None:
    """(In the same test: one stack.)"""
    c = stack.client
    for path in ("../x.safetensors", "/etc/passwd.safetensors", "x.pt", "a\x1b[2J.safetensors"):
        assert fields(c.post("/jobs", json=job(2, weights={"path": path}))) == {"weights.path"}
    assert fields(c.post("/jobs", json=job(2, weights={"path": "x" * 2000}))) == {"weights.path"}

    marker = tmp_path / "unpickled"
    root = tmp_path / "weights"
    root.mkdir(exist_ok=True)
    (root / "evil.safetensors").write_bytes(pickle.dumps(_Marker(str(marker))))
    evil = c.post("/jobs", json=job(2, weights={"path": "evil.safetensors"})).json()["id"]
    failed = stack.wait_for_status(evil, "failed")
    assert failed["error"]["code"] == "invalid_spec"
    assert failed["error"]["message"].startswith("weights.path: 'evil.safetensors': not a")
    assert failed["attempt"] == 1 and not marker.exists()
