"""A fork's start in the engine (no service): the parent's checkpoint loaded as a resume
loads it, the optimizer's state kept for the same kind with the fork's hyper-parameters over
it and fresh for another kind, its own checkpoint of the fork step written first, the pin
released, and a parent checkpoint that is gone refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.contract.errors import ResumeMismatchError
from amptrain.contract.layout import pin_name
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from amptrain.engine.context import ForkOrigin
from tests.support.sinks import ListSink
from tests.support.specs import mlp_job

FORK = "j_" + "c" * 32


def spec(max_steps: int, **overrides: Any) -> dict[str, Any]:
    fields = {"precision": "fp32", "batch_size": 8, "checkpoint": {"every_steps": 2}}
    return mlp_job(max_steps, **{**fields, **overrides})


def fork(tmp_path: Path, child: dict[str, Any], fork_id: str = FORK) -> tuple[Trainer, ListSink]:
    origin = ForkOrigin(str(tmp_path / "parent"), 2, "j_parent", fork_id)
    sink = ListSink()
    ctx = RunContext(checkpoint_dir=str(tmp_path / fork_id), sink=sink, fork=origin)
    trainer = Trainer(parse_spec(child), ctx)
    trainer.train()
    return trainer, sink


PARENT_LR: dict[int, float] = {}


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    sink = ListSink()
    ctx = RunContext(checkpoint_dir=str(tmp_path / "parent"), sink=sink)
    Trainer(parse_spec(spec(4)), ctx).train()
    PARENT_LR.update({step: r["lr"] for step, r in sink.metrics().items()})
    (tmp_path / "parent" / pin_name(2, FORK)).write_bytes(b"")
    return tmp_path


def test_a_new_lr_keeps_the_moments_and_another_optimizer_starts_fresh(parent: Path) -> None:
    store = CheckpointStore(str(parent / "parent"), writer=False)
    at_fork = store.load(store.path("step-000000002.pt"))

    _, sink = fork(parent, spec(3, optimizer={"lr": 5e-4}))
    (event,) = sink.events("forked")
    assert event["step"] == 2 and event["data"]["optimizer"] == "kept"
    assert [r["step"] for r in sink.items if r["kind"] == "metric"] == [3]
    own = CheckpointStore(str(parent / FORK), writer=False)
    copy = own.load(own.path("step-000000002.pt"))  # its first state, before its step 3
    for name, tensor in at_fork["model"].items():
        assert torch.equal(copy["model"][name], tensor), name
    assert copy["optimizer"]["state"][0]["exp_avg"].equal(
        at_fork["optimizer"]["state"][0]["exp_avg"]
    )
    # The schedule's position is the parent's (2 applied steps), its values the fork's.
    assert 0 < sink.metrics()[3]["lr"] < PARENT_LR[3]
    assert not list((parent / "parent").glob("*.pin-*"))

    _, sink = fork(parent, spec(3, optimizer={"name": "sgd", "lr": 0.01}), "j_" + "d" * 32)
    assert sink.events("forked")[0]["data"]["optimizer"] == "fresh"


def test_a_parent_checkpoint_that_is_gone_is_refused(parent: Path) -> None:
    for path in (parent / "parent").glob("step-000000002.*"):
        path.unlink()
    with pytest.raises(ResumeMismatchError, match="no checkpoint at step 2"):
        fork(parent, spec(3))


def test_precision_auto_trains_on_in_the_checkpoints_precision(parent: Path) -> None:
    """``auto`` (inherited, or asked for) is what the parent's checkpoint was written in,
    as for a resume: measuring again could choose otherwise and break bitwise."""
    trainer, _ = fork(parent, spec(3, precision="auto"))
    assert trainer.parts.precision.effective == "fp32"
    assert "recorded by the checkpoint" in trainer.parts.precision.reason
