"""Evaluation metrics computed by torchmetrics (macro F1, precision, recall, AUROC and the
confusion matrix): equal to scikit-learn's on the same predictions of real data (a model
briefly trained on scikit-learn's digits), recorded as named series beside the others, the
matrix as an event after each evaluation, reset per evaluation, no change to training; and
every metric a job's task cannot give refused by name, at submit and by the worker. Their
sync across 2 data-parallel ranks is checked in ``test_ddp.py`` (the ``library`` scenario
of ``ddp_ranks.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
import torch
from sklearn import metrics as skm

from amptrain.components import registry
from amptrain.components.held_out import held_out_of
from amptrain.contract.catalog import validate_components
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from tests.support.digits import write_digits
from tests.support.sinks import ListSink

LIBRARY = ["f1_macro", "precision_macro", "recall_macro", "auroc_macro"]


def spec(**overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 32, "dropout": 0.1}},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 16, "num_samples": 256, "classes": 10},
            },
            "max_steps": 6,
            "batch_size": 16,
            "precision": "fp32",
            "device": "cpu",
            "checkpoint": {"every_steps": 1000},
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digits(tmp_path_factory.mktemp("data"))


def sklearn_values(probs: np.ndarray, targets: np.ndarray) -> dict[str, Any]:
    """The independent computation: scikit-learn on the same predictions."""
    predicted = probs.argmax(-1)
    return {
        "accuracy": skm.accuracy_score(targets, predicted),
        "f1_macro": skm.f1_score(targets, predicted, average="macro"),
        "precision_macro": skm.precision_score(
            targets, predicted, average="macro", zero_division=0
        ),
        "recall_macro": skm.recall_score(targets, predicted, average="macro"),
        "auroc_macro": skm.roc_auc_score(targets, probs, multi_class="ovr", average="macro"),
        "confusion_matrix": skm.confusion_matrix(targets, predicted, labels=range(10)).tolist(),
    }


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_digits_metrics_equal_sklearn_on_the_final_checkpoint(
    tmp_path: Path, digits_root: Path, precision: str
) -> None:
    job = spec(
        model={"name": "mlp", "args": {"width": 32}},
        dataset={"name": "tensors", "args": {"path": "digits.npz", "val_fraction": 0.2}},
        max_steps=40,
        batch_size=64,
        precision=precision,
        optimizer={"name": "adamw", "lr": 0.003},
        checkpoint={"every_steps": 40},
        # 100 batches of 64 cover all 359 held-out rows; names in any order, each once.
        eval={
            "every_steps": 20,
            "batches": 100,
            "metrics": ["confusion_matrix", "accuracy", *LIBRARY[::-1]],
        },
    )
    sink = ListSink()
    ctx = RunContext(str(tmp_path), sink=sink, data_roots=[str(digits_root)])
    result = Trainer(job, ctx).train()

    evals = [r for r in sink.items if r["kind"] == "eval"]
    # Named series in the table's order; the matrix is no series.
    assert [(r["step"], list(r["values"])) for r in evals] == [
        (step, ["accuracy", *LIBRARY]) for step in (20, 40)
    ]
    # Each evaluation's matrix comes right after its eval record, as an event at its step.
    kinds = [(r["kind"], r.get("type"), r["step"]) for r in sink.items if r["kind"] != "metric"]
    for step in (20, 40):
        at = kinds.index(("eval", None, step))
        assert kinds[at + 1] == ("event", "confusion_matrix", step)
    matrices = sink.events("confusion_matrix")
    # Reset per evaluation: each counts the 359 rows once (the second is not cumulative).
    assert [(m["data"]["classes"], m["data"]["samples"]) for m in matrices] == [(10, 359)] * 2
    assert result.eval == evals[-1]["values"]
    assert result.eval["f1_macro"] > 0.5  # learned something: the comparison is not trivial

    # Independently: the final checkpoint in a fresh model, every held-out row, scikit-learn.
    store = CheckpointStore(str(tmp_path), keep_last=1, writer=False)
    latest = store.latest()
    assert latest is not None
    data = registry.build_dataset(job.dataset, seed=job.seed, data_roots=[str(digits_root)])
    held = held_out_of(data)
    model = registry.build_model(job.model, data.info)
    model.load_state_dict(store.load(latest)["model"])
    model.eval()
    inputs, targets = held.batch(0, len(held))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        logits = model(inputs)
    probs = logits.float().softmax(-1).numpy()
    expected = sklearn_values(probs, targets.numpy())
    assert matrices[-1]["data"]["matrix"] == expected.pop("confusion_matrix")
    for name, value in expected.items():
        assert result.eval[name] == pytest.approx(value, abs=1e-5), name


def test_library_metrics_leave_training_bitwise_alone(tmp_path: Path) -> None:
    # dropout in the model: any draw from the global generators would change its masks.
    metrics = {"every_steps": 2, "batches": 2, "metrics": [*LIBRARY, "confusion_matrix"]}
    on = Trainer(spec(eval=metrics), RunContext(str(tmp_path / "on")))
    assert set(on.train().eval or {}) == set(LIBRARY)
    off = Trainer(spec(eval={"enabled": False}), RunContext(str(tmp_path / "off")))
    off.train()
    for (name, x), (_, y) in zip(
        on.model.named_parameters(), off.model.named_parameters(), strict=True
    ):
        assert torch.equal(x, y), name


LM = {"name": "synthetic-text", "args": {"num_samples": 64, "seq_len": 8, "vocab_size": 32}}
LM_MODEL = {"name": "transformer", "args": {"d_model": 16, "n_heads": 2, "n_layers": 1}}


@pytest.mark.parametrize(
    ("dataset", "metrics", "refused"),
    [
        (LM, ["perplexity", "accuracy"], "accuracy"),
        (LM, ["f1_macro", "confusion_matrix"], "f1_macro, confusion_matrix"),
        (
            {"name": "tensors", "args": {"path": "x.npz", "task": "language_model"}},
            ["auroc_macro"],
            "auroc_macro",
        ),
        ({"name": "synthetic-classification"}, ["token_accuracy", "f1_macro"], "token_accuracy"),
    ],
)
def test_a_metric_the_task_cannot_give_is_refused_at_submit(
    dataset: dict[str, Any], metrics: list[str], refused: str
) -> None:
    model = {"name": "mlp"} if refused == "token_accuracy" else LM_MODEL
    job = spec(model=model, dataset=dataset, eval={"metrics": metrics})
    (problem,) = validate_components(job)
    assert problem["loc"] == ["eval", "metrics"]
    assert problem["msg"].startswith(f"{refused}: not computed for a ")


def test_what_the_worker_alone_can_refuse_names_eval_metrics(tmp_path: Path) -> None:
    lm = spec(model=LM_MODEL, dataset=LM, eval={"metrics": ["accuracy"]})
    with pytest.raises(
        InvalidSpecError, match=r"^eval\.metrics: accuracy: not computed for a language"
    ):
        Trainer(lm, RunContext(None))
    few = spec(dataset={"name": "synthetic-classification", "args": {"classes": 4}})
    few = few.model_copy(
        update={"eval": few.eval.model_copy(update={"metrics": ["top5_accuracy"]})}
    )
    with pytest.raises(InvalidSpecError, match=r"^eval\.metrics: top5_accuracy needs more than 5"):
        Trainer(few, RunContext(None))
    wide = spec(
        dataset={"name": "synthetic-classification", "args": {"features": 4, "classes": 101}},
        eval={"metrics": ["confusion_matrix"]},
    )
    with pytest.raises(InvalidSpecError, match=r"^eval\.metrics: confusion_matrix .* at most 100"):
        Trainer(wide, RunContext(None))
    # An endless held-out split: 10^4 batches x 64 rows x 1,000 classes of scores is refused.
    images = {"name": "synthetic-images", "args": {"height": 4, "width": 4, "classes": 1000}}
    huge = spec(
        model={"name": "mlp", "args": {"width": 8}},
        dataset=images,
        batch_size=64,
        eval={"batches": 10_000, "metrics": ["auroc_macro"]},
    )
    with pytest.raises(
        InvalidSpecError, match=r"^eval\.metrics: auroc_macro keeps .*eval\.batches"
    ):
        Trainer(huge, RunContext(None))


def test_hostile_metric_lists_are_bounded_422s() -> None:
    with pytest.raises(pydantic.ValidationError) as unknown:
        spec(eval={"metrics": ["f1_macro", "f1_micro"]})
    assert "eval.metrics" in str(unknown.value) and "'f1_micro'" in str(unknown.value)
    with pytest.raises(pydantic.ValidationError) as many:
        spec(eval={"metrics": ["f1_macro"] * 10_000})
    text = str(many.value)
    assert "eval.metrics" in text and "at most 64" in text
    assert len(text) < 2_000  # the 10^4 names are not echoed back
    with pytest.raises(pydantic.ValidationError, match=r"eval\.metrics"):
        spec(eval={"metrics": ["x" * 10_000]})
