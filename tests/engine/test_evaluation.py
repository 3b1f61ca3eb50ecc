"""Evaluation on the held-out split: when it runs, what it emits, that it leaves training
bitwise alone (straight and resumed), and that its accuracy on real data is what an
independent evaluation of the final checkpoint finds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
import torch

from amptrain.components import registry
from amptrain.components.held_out import held_out_of
from amptrain.contract.errors import InvalidSpecError, PreemptedError
from amptrain.contract.spec import parse_spec
from amptrain.engine import Components, RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from amptrain.engine.evaluation import task_metrics
from tests.support.digits import write_digits
from tests.support.sinks import ListSink

pytestmark = pytest.mark.usefixtures("read_mode")


def spec(**overrides: Any) -> Any:
    return parse_spec(
        {
            # dropout: evaluation must leave the RNG stream (and train mode) as it found them
            "model": {"name": "mlp", "args": {"width": 32, "dropout": 0.1}},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 16, "num_samples": 256, "classes": 10},
            },
            "max_steps": 10,
            "batch_size": 16,
            "precision": "fp32",
            "device": "cpu",
            "checkpoint": {"every_steps": 4, "keep_last": 2},
            "eval": {"every_steps": 4, "batches": 2},
            **overrides,
        }
    )


def evals(sink: ListSink) -> list[dict[str, Any]]:
    return [r for r in sink.items if r["kind"] == "eval"]


def test_eval_records_at_every_steps_boundaries_and_once_at_the_end(tmp_path: Path) -> None:
    sink = ListSink()
    result = Trainer(spec(), RunContext(str(tmp_path), sink=sink)).train()
    found = evals(sink)
    assert [r["step"] for r in found] == [4, 8, 10]
    names = task_metrics("classification", 10)
    assert names == ("eval_loss", "accuracy", "top5_accuracy")
    for r in found:
        assert tuple(r["values"]) == names
        assert 0.0 <= r["values"]["accuracy"] <= r["values"]["top5_accuracy"] <= 1.0
        assert r["values"]["eval_loss"] > 0
    assert result.eval == found[-1]["values"]
    # In order with the metric records: each eval follows its own step's metric record.
    kinds = [(r["kind"], r["step"]) for r in sink.items if r["kind"] in ("metric", "eval")]
    for r in found:
        assert kinds[kinds.index(("eval", r["step"])) - 1] == ("metric", r["step"])

    # Both triggers on the last step: one evaluation, not two; a chosen subset only.
    sink = ListSink()
    only = spec(max_steps=8, eval={"every_steps": 4, "batches": 1, "metrics": ["accuracy"]})
    Trainer(only, RunContext(str(tmp_path / "b"), sink=sink)).train()
    assert [(r["step"], list(r["values"])) for r in evals(sink)] == [
        (4, ["accuracy"]),
        (8, ["accuracy"]),
    ]


def test_language_model_metrics(tmp_path: Path) -> None:
    sink = ListSink()
    lm = spec(
        model={"name": "transformer", "args": {"d_model": 16, "n_heads": 2, "n_layers": 1}},
        dataset={
            "name": "synthetic-text",
            "args": {"num_samples": 128, "seq_len": 8, "vocab_size": 32},
        },
        max_steps=2,
        eval={"batches": 1},
    )
    result = Trainer(lm, RunContext(str(tmp_path), sink=sink)).train()
    assert result.eval is not None
    assert list(result.eval) == ["eval_loss", "perplexity", "token_accuracy"]
    assert result.eval["perplexity"] == pytest.approx(np.exp(result.eval["eval_loss"]))
    assert 0.0 <= result.eval["token_accuracy"] <= 1.0


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(x, y), name


def test_evaluation_does_not_change_training(tmp_path: Path) -> None:
    # Each built and trained in turn: a Trainer seeds the global generators when built.
    on = Trainer(spec(eval={"every_steps": 2, "batches": 3}), RunContext(str(tmp_path / "on")))
    assert on.train().eval is not None
    off = Trainer(spec(eval={"enabled": False}), RunContext(str(tmp_path / "off")))
    assert off.train().eval is None
    _same_weights(on.model, off.model)
    assert on.model.training  # back in train mode


class _DrawingHeldOut:
    """A held-out split whose reads draw from every global generator (a plugin may)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.info = inner, inner.info

    def __len__(self) -> int:
        return len(self.inner)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.rand(1), random.random(), np.random.rand()
        return self.inner.batch(start, size)


class _Drawing:
    def __init__(self, inner: Any) -> None:
        self.inner, self.info = inner, inner.info

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.batch(start, size)

    def held_out(self) -> _DrawingHeldOut:
        return _DrawingHeldOut(held_out_of(self.inner))


def test_a_held_out_split_drawing_random_numbers_does_not_change_training(
    tmp_path: Path,
) -> None:
    def parts(job: Any) -> Components:
        torch.manual_seed(job.seed)
        data = registry.build_dataset(job.dataset, seed=job.seed)
        model = registry.build_model(job.model, data.info)
        return Components(model=model, dataset=_Drawing(data), loss_fn=registry.loss_for(data.info))

    trained = []
    for i, enabled in enumerate((True, False)):
        job = spec(eval={"enabled": enabled, "every_steps": 2, "batches": 2})
        trainer = Trainer(job, RunContext(str(tmp_path / str(i))), parts(job))
        trainer.train()
        trained.append(trainer.model)
    _same_weights(*trained)  # dropout drew the same masks: the generators were put back


def test_resume_is_bitwise_exact_with_eval_on(tmp_path: Path) -> None:
    longer = {"max_steps": 12}
    straight = Trainer(spec(**longer), RunContext(str(tmp_path / "straight")))
    straight.train()

    ref: list[Trainer] = []
    stop = lambda: "preempt" if ref and ref[0].step == 6 else None  # noqa: E731
    first = Trainer(spec(**longer), RunContext(str(tmp_path / "split"), should_stop=stop))
    ref.append(first)
    with pytest.raises(PreemptedError):
        first.train()
    sink = ListSink()
    second = Trainer(spec(**longer), RunContext(str(tmp_path / "split"), sink=sink))
    result = second.train()
    assert (result.resumed_from, result.final_step) == (6, 12)
    assert [r["step"] for r in evals(sink)] == [8, 12]
    _same_weights(straight.model, second.model)


def test_unknown_eval_metric_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        spec(eval={"metrics": ["accuracy", "f1_score"]})
    assert "eval.metrics" in str(info.value)
    assert "f1_score" in str(info.value)


# -- real data ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digits(tmp_path_factory.mktemp("data"))


def test_eval_enabled_without_a_held_out_split_is_refused(
    tmp_path: Path, digits_root: Path
) -> None:
    # tensors without val_path or val_fraction has no held-out split to evaluate on.
    job = spec(
        dataset={"name": "tensors", "args": {"path": "digits.npz"}},
        eval={"enabled": True},
    )
    with pytest.raises(InvalidSpecError, match=r"eval\.enabled"):
        Trainer(job, RunContext(str(tmp_path), data_roots=[str(digits_root)]))
    # Left at null, the same job trains without evaluating.
    job = spec(dataset={"name": "tensors", "args": {"path": "digits.npz"}}, max_steps=1)
    ctx = RunContext(str(tmp_path / "b"), data_roots=[str(digits_root)])
    assert Trainer(job, ctx).train().eval is None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_digits_accuracy_matches_an_independent_evaluation_of_the_checkpoint(
    tmp_path: Path, digits_root: Path, precision: str
) -> None:
    dataset = {
        "name": "tensors",
        "args": {"path": "digits.npz", "task": "classification", "val_fraction": 0.2},
    }
    job = spec(
        model={"name": "mlp", "args": {"width": 64}},
        dataset=dataset,
        max_steps=150,
        batch_size=64,
        precision=precision,
        optimizer={"name": "adamw", "lr": 0.003},
        checkpoint={"every_steps": 1000},
        eval={"batches": 100},
    )
    ctx = RunContext(str(tmp_path / "ckpt"), data_roots=[str(digits_root)])
    result = Trainer(job, ctx).train()
    assert result.eval is not None
    assert result.eval["accuracy"] > 0.8

    # Independently: the final checkpoint's weights in a fresh model, on every held-out row.
    store = CheckpointStore(str(tmp_path / "ckpt"), keep_last=1, writer=False)
    latest = store.latest()
    assert latest is not None
    state = store.load(latest)
    assert state["step"] == 150
    data = registry.build_dataset(job.dataset, seed=job.seed, data_roots=[str(digits_root)])
    held = held_out_of(data)
    assert len(held) == 359  # 20 % of 1,797 rows, every one evaluated (batches cover them)
    model = registry.build_model(job.model, data.info)
    model.load_state_dict(state["model"])
    model.eval()
    inputs, targets = held.batch(0, len(held))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=precision == "bf16"):
        predicted = model(inputs).argmax(-1)
    accuracy = (predicted == targets).double().mean().item()
    assert result.eval["accuracy"] == pytest.approx(accuracy, abs=1e-6)
