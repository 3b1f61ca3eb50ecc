"""A job starts from a safetensors file under the weights roots (``spec.weights``), and every
checkpoint exports its model as one: one job's result starts the next, bit for bit."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from tests.support.sinks import ListSink


def spec(weights: dict[str, Any] | None = None, classes: int = 10, **overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 16}},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 8, "num_samples": 128, "classes": classes},
            },
            "max_steps": 3,
            "batch_size": 16,
            "precision": "fp32",
            "device": "cpu",
            "seed": 1,
            "checkpoint": {"every_steps": 100, "keep_last": 5},
            **({"weights": weights} if weights else {}),
            **overrides,
        }
    )


def train_a(tmp_path: Path) -> tuple[Trainer, Path]:
    """Job A trained 3 steps; its exported final weights, copied into a weights root."""
    trainer = Trainer(spec(), RunContext(str(tmp_path / "a")))
    trainer.train()
    exported = tmp_path / "a" / "step-000000003.safetensors"
    root = tmp_path / "weights"
    root.mkdir(exist_ok=True)
    (root / "a.safetensors").write_bytes(exported.read_bytes())
    return trainer, root


def test_an_exported_checkpoint_starts_the_next_job_bitwise(tmp_path: Path) -> None:
    a, root = train_a(tmp_path)
    final = {k: v.clone() for k, v in a.model.state_dict().items()}
    sink = ListSink()
    ctx = RunContext(str(tmp_path / "b"), sink=sink, weights_roots=[str(root)])
    b = Trainer(spec({"path": "a.safetensors"}, seed=7), ctx)
    assert not all(torch.equal(final[k], v) for k, v in b.model.state_dict().items())
    b.train()

    # B's step-0 checkpoint: its weights before its first optimizer step.
    start = CheckpointStore(str(tmp_path / "b")).load(str(tmp_path / "b" / "step-000000000.pt"))
    assert start["model"].keys() == final.keys()
    for name, tensor in final.items():
        assert torch.equal(start["model"][name], tensor), name
        assert start["model"][name].dtype == tensor.dtype
    (loaded,) = sink.events("weights")
    assert loaded["step"] == 0 and loaded["data"]["loaded"] == len(final)
    assert "missing" not in loaded["data"] and "cast_from" not in loaded["data"]
    assert b.step == 3  # and it trained on from there


def test_a_resumed_attempt_loads_its_checkpoint_not_the_file(tmp_path: Path) -> None:
    _, root = train_a(tmp_path)
    weights = {"path": "a.safetensors"}
    ctx = RunContext(str(tmp_path / "b"), weights_roots=[str(root)], should_stop=lambda: "preempt")
    with pytest.raises(Exception, match="preempted"):
        Trainer(spec(weights), ctx).train()
    (root / "a.safetensors").write_bytes(b"replaced by an operator meanwhile")
    sink = ListSink()
    again = RunContext(str(tmp_path / "b"), sink=sink, weights_roots=[str(root)], attempt=2)
    assert Trainer(spec(weights), again).train().resumed_from == 0
    assert not sink.events("weights")


def test_strict_names_the_first_mismatch_and_loads_nothing(tmp_path: Path) -> None:
    _, root = train_a(tmp_path)
    ctx = RunContext(None, weights_roots=[str(root)])
    trainer = Trainer(spec({"path": "a.safetensors"}, classes=4), ctx)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(InvalidSpecError) as caught:
        trainer.train()
    assert str(caught.value).startswith("weights.path 'a.safetensors': shape of net.9.weight")
    assert "is (10, 16) in the file, (4, 16) in the model" in str(caught.value)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_non_strict_loads_the_trunk_and_reports_the_new_head(tmp_path: Path) -> None:
    a, root = train_a(tmp_path)
    half = {k: v.half() for k, v in a.model.state_dict().items()}
    (root / "half.safetensors").write_bytes(safetensors.torch.save(half))
    sink = ListSink()
    ctx = RunContext(None, sink=sink, weights_roots=[str(root)])
    weights = {"path": "half.safetensors", "strict": False}
    b = Trainer(spec(weights, classes=4, max_steps=1, optimizer={"lr": 1e-12}), ctx)
    b.train()
    (event,) = sink.events("weights")
    data = event["data"]
    assert data["shape"] == {"net.9.weight": [[10, 16], [4, 16]], "net.9.bias": [[10], [4]]}
    assert data["loaded"] == len(half) - 2 and data["cast_from"] == ["float16"]
    trunk = b.model.state_dict()["net.1.weight"]
    assert trunk.dtype == torch.float32
    assert torch.allclose(trunk, half["net.1.weight"].float(), atol=1e-6)


class _Marker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def _hostile(tmp_path: Path, root: Path) -> dict[str, str]:
    marker = tmp_path / "unpickled"
    (root / "pickle.safetensors").write_bytes(pickle.dumps(_Marker(str(marker))))
    torch.save({"x": torch.ones(2)}, root / "torchsave.safetensors")
    header = struct.pack("<Q", 2**62) + b"{}"
    (root / "huge-header.safetensors").write_bytes(header)
    (root / "dir.safetensors").mkdir()
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(safetensors.torch.save({"x": torch.ones(2)}))
    os.symlink(outside, root / "link.safetensors")
    return {
        "pickle.safetensors": "not a safetensors file",
        "torchsave.safetensors": "not a safetensors file",
        "huge-header.safetensors": "not a safetensors file",
        "dir.safetensors": "is a directory, not a regular file",
        "link.safetensors": "could not be opened beneath",
        "../outside.safetensors": "must stay inside the weights roots",
        str(outside): "is outside the allowed weights roots",
        "a.pt": "must name a .safetensors file",
    }


def test_hostile_files_are_refused_naming_the_field_and_nothing_is_unpickled(
    tmp_path: Path,
) -> None:
    root = tmp_path / "weights"
    root.mkdir()
    for path, problem in _hostile(tmp_path, root).items():
        trainer = Trainer(spec({"path": path}), RunContext(None, weights_roots=[str(root)]))
        with pytest.raises(InvalidSpecError) as caught:
            trainer.train()
        assert str(caught.value).startswith("weights.path"), path
        assert problem in str(caught.value), (path, str(caught.value))
    assert not (tmp_path / "unpickled").exists()
