"""Plugins: components from other packages, found through entry points.

Rather than pip-installing the example plugin into the shared venv (slow, and it
would outlive the test), the tests write the ``*.dist-info`` directory that pip
would have written — METADATA plus entry_points.txt generated from the plugin's
own pyproject.toml — into a temporary directory on ``sys.path``;
``importlib.metadata`` discovers it exactly as it would an installed package.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch

from amptrain.components import registry
from amptrain.components.base import DataInfo
from amptrain.components.held_out import held_out_of
from amptrain.contract import catalog
from amptrain.contract.catalog import MetricRegistration
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import ComponentRef, parse_spec
from amptrain.contract.spec_file import load_spec_file
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from tests.support.sinks import ListSink

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "amptrain_example_plugin"
PLUGIN_SRC = PLUGIN / "src"


def write_dist_info(site: Path, name: str, entry_points: dict[str, dict[str, str]]) -> None:
    """What ``pip install`` leaves behind that importlib.metadata reads."""
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{ep} = {target}" for ep, target in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def example_plugin_site(site: Path) -> list[Path]:
    """Make the example plugin discoverable; returns the paths to put on sys.path/PYTHONPATH."""
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    write_dist_info(site, project["name"], project["entry-points"])
    return [site, PLUGIN_SRC]


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for path in example_plugin_site(tmp_path / "site"):
        monkeypatch.syspath_prepend(str(path))
    for mod in [m for m in sys.modules if m.startswith("amptrain_example_plugin")]:
        monkeypatch.delitem(sys.modules, mod)
    return tmp_path / "site"


def test_catalog_lists_plugins_without_importing_them(plugin: Path) -> None:
    cat = catalog.catalog()
    assert cat["models"]["logreg"] == {
        "name": "logreg",
        "source": "plugin",
        "entry_point": "amptrain_example_plugin.registrations:LOGREG",
        "args": None,
    }
    assert cat["datasets"]["example-blobs"]["source"] == "plugin"
    assert cat["models"]["mlp"]["source"] == "builtin"
    spec = parse_spec(
        {"model": {"name": "logreg"}, "dataset": {"name": "example-blobs"}, "max_steps": 1}
    )
    assert catalog.validate_components(spec) == []
    assert not any(m.startswith("amptrain_example_plugin") for m in sys.modules)


def test_example_plugin_dataset_offers_a_held_out_split(plugin: Path) -> None:
    blobs = registry.build_dataset(ComponentRef(name="example-blobs"), seed=0)
    held = held_out_of(blobs)
    train = {r.numpy().tobytes() for r in blobs.batch(0, 256)[0]}
    assert not {r.numpy().tobytes() for r in held.batch(0, 64)[0]} & train
    again = held_out_of(registry.build_dataset(ComponentRef(name="example-blobs"), seed=0))
    assert torch.equal(again.batch(0, 8)[0], held.batch(0, 8)[0])


def test_without_the_plugin_its_names_are_unknown() -> None:
    spec = parse_spec({"model": {"name": "logreg"}, "dataset": {"name": "mlp"}, "max_steps": 1})
    errors = catalog.validate_components(spec)
    assert errors[0]["loc"] == ["model", "name"] and "unknown model 'logreg'" in errors[0]["msg"]


def blobs_spec(**overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "logreg"},
            "dataset": {"name": "example-blobs", "args": {"classes": 4, "spread": 0.5}},
            "max_steps": 30,
            "batch_size": 32,
            "optimizer": {"lr": 0.05},
            "device": "cpu",
            "precision": "fp32",
            "eval": {"every_steps": 10, "batches": 4, "metrics": ["accuracy", "brier_score"]},
            **overrides,
        }
    )


def test_plugin_components_build_check_args_and_train(plugin: Path) -> None:
    with pytest.raises(
        InvalidSpecError,
        match=r"^dataset.args.sprad: unexpected argument; allowed: classes, features, spread$",
    ):
        registry.build_dataset(ComponentRef(name="example-blobs", args={"sprad": 1}), seed=0)
    with pytest.raises(InvalidSpecError, match=r"^model.args.bias: expected bool, got int 1$"):
        registry.build_model(
            ComponentRef(name="logreg", args={"bias": 1}),
            DataInfo("classification", (2,), 3),
        )
    spec = blobs_spec(
        model={"name": "logreg", "args": {"bias": False}},
        dataset={"name": "example-blobs", "args": {"classes": 4, "spread": 0.2}},
        max_steps=40,
    )
    items: list[dict[str, Any]] = []
    sink = type(
        "Sink", (), {"write": lambda self, batch: items.extend(batch), "close": lambda self: None}
    )()
    Trainer(spec, RunContext(checkpoint_dir=None, sink=sink)).train()
    losses = [r["loss"] for r in items if r["kind"] == "metric"]
    assert len(losses) == 40 and sum(losses[-5:]) < 0.5 * sum(losses[:5])


def test_broken_and_clashing_plugins_are_reported_or_ignored(plugin: Path, tmp_path: Path) -> None:
    write_dist_info(
        plugin,
        "broken-plugin",
        {
            "amptrain.models": {
                "missing": "amptrain_example_plugin.registrations:NOPE",
                "wrong-kind": "amptrain_example_plugin.registrations:BLOBS",
                "renamed": "amptrain_example_plugin.registrations:LOGREG",
                "mlp": "amptrain_example_plugin.registrations:LOGREG",
            }
        },
    )
    assert catalog.catalog()["models"]["mlp"]["source"] == "builtin"  # built-ins cannot be replaced
    info = DataInfo("classification", (2,), 3)
    assert type(registry.build_model(ComponentRef(name="mlp"), info)).__name__ == "MLP"
    for name, message in [
        (
            "missing",
            r"^model.name: plugin 'missing' \(amptrain_example_plugin.registrations:NOPE\) failed to load",
        ),
        (
            "wrong-kind",
            r"must point at a amptrain.contract.catalog.Registration of kind 'model'",
        ),
        ("renamed", r"points at a registration named 'logreg'"),
    ]:
        with pytest.raises(InvalidSpecError, match=message):
            registry.build_model(ComponentRef(name=name), info)


def test_a_team_metric_is_evaluated_beside_the_built_ins(plugin: Path, tmp_path: Path) -> None:
    sink = ListSink()
    ctx = RunContext(str(tmp_path / "ckpt"), sink=sink)
    result = Trainer(blobs_spec(checkpoint={"every_steps": 30}), ctx).train()
    found = [r for r in sink.items if r["kind"] == "eval"]
    assert [(r["step"], list(r["values"])) for r in found] == [
        (step, ["accuracy", "brier_score"]) for step in (10, 20, 30)
    ]
    briers = [r["values"]["brier_score"] for r in found]
    assert briers[-1] < briers[0]  # training improved it, as it does the accuracy
    assert result.eval == found[-1]["values"]

    # Independently: the plugin's formula over the same held-out rows, final checkpoint.
    state = CheckpointStore(str(tmp_path / "ckpt"), keep_last=1, writer=False)
    latest = state.latest()
    assert latest is not None
    job = blobs_spec()
    data = registry.build_dataset(job.dataset, seed=job.seed)
    model = registry.build_model(job.model, data.info)
    model.load_state_dict(state.load(latest)["model"])
    inputs, targets = held_out_of(data).batch(0, 4 * 32)
    with torch.no_grad():
        p = model(inputs).softmax(-1)
    expected = (p - torch.eye(4)[targets]).pow(2).sum(-1).double().mean().item()
    assert result.eval["brier_score"] == pytest.approx(expected, rel=1e-6)


def test_a_team_torchmetrics_metric_is_evaluated_by_its_class(plugin: Path, tmp_path: Path) -> None:
    sink = ListSink()
    job = blobs_spec(
        max_steps=10,
        checkpoint={"every_steps": 10},
        eval={"batches": 4, "metrics": ["cohen_kappa", "accuracy"]},
    )
    result = Trainer(job, RunContext(str(tmp_path), sink=sink)).train()
    (found,) = [r for r in sink.items if r["kind"] == "eval"]
    assert list(found["values"]) == ["accuracy", "cohen_kappa"]  # built-ins, then the plugin's
    assert result.eval == found["values"]

    # Independently: scikit-learn's kappa of the final checkpoint's predictions.
    from sklearn.metrics import cohen_kappa_score

    store = CheckpointStore(str(tmp_path), keep_last=1, writer=False)
    latest = store.latest()
    assert latest is not None
    data = registry.build_dataset(job.dataset, seed=job.seed)
    model = registry.build_model(job.model, data.info)
    model.load_state_dict(store.load(latest)["model"])
    inputs, targets = held_out_of(data).batch(0, 4 * 32)
    with torch.no_grad():
        predicted = model(inputs).argmax(-1)
    expected = cohen_kappa_score(targets.numpy(), predicted.numpy())
    assert result.eval["cohen_kappa"] == pytest.approx(expected, abs=1e-6)


def test_metric_names_come_from_installed_plugins(plugin: Path) -> None:
    listed = {m["name"]: m for m in catalog.catalog()["eval_metrics"]}
    assert listed["brier_score"] == {
        "name": "brier_score",
        "source": "plugin",
        "entry_point": "amptrain_example_plugin.registrations:BRIER",
    }
    assert listed["accuracy"]["better"] == "higher"  # the built-ins keep their definitions
    assert not any(m.startswith("amptrain_example_plugin") for m in sys.modules)
    with pytest.raises(pydantic.ValidationError, match=r"f1_score.*known: .*'brier_score'"):
        blobs_spec(eval={"metrics": ["brier_score", "f1_score"]})


def test_without_the_plugin_its_metric_is_unknown() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"eval.metrics[\s\S]*'brier_score'"):
        blobs_spec()


def test_a_metric_registration_takes_only_a_free_series_name() -> None:
    for taken in ("loss", "accuracy", "Brier", "x" * 49):
        with pytest.raises(ValueError, match="metric name"):
            MetricRegistration(name=taken, compute=len, description="d", better="lower")


def test_broken_metric_plugins_fail_the_job_saying_why(plugin: Path, tmp_path: Path) -> None:
    (plugin / "odd_metrics.py").write_text(
        "from amptrain.contract.catalog import MetricRegistration\n"
        "TOTAL = MetricRegistration(name='batch_total', compute=lambda logits, targets: "
        "logits.sum(), description='not per sample', better='lower')\n"
        "NOT_A_CLASS = MetricRegistration(name='not_a_class', compute='collections:Counter', "
        "description='a class, not a torchmetrics.Metric', better='lower')\n"
        "MATRIX = MetricRegistration(name='a_matrix', compute='torchmetrics.classification:"
        "MulticlassConfusionMatrix', description='not one value', better='lower')\n"
    )
    write_dist_info(
        plugin,
        "odd-metrics",
        {
            "amptrain.metrics": {
                "batch_total": "odd_metrics:TOTAL",
                "not_a_metric": "amptrain_example_plugin.registrations:LOGREG",
                "not_a_class": "odd_metrics:NOT_A_CLASS",
                "a_matrix": "odd_metrics:MATRIX",
            }
        },
    )
    for name, message in [
        ("batch_total", r"^eval.metrics: metric 'batch_total' returned \(\); it must return one"),
        ("not_a_metric", r"^eval.metrics: plugin entry point 'not_a_metric' .*MetricRegistration"),
        ("not_a_class", r"^eval.metrics: metric 'not_a_class' names the class Counter, which"),
        ("a_matrix", r"^eval.metrics: metric 'a_matrix' computed \(4, 4\); a torchmetrics"),
    ]:
        job = blobs_spec(max_steps=2, eval={"metrics": [name]})
        with pytest.raises(InvalidSpecError, match=message):
            Trainer(job, RunContext(str(tmp_path / name))).train()


def test_the_plugin_tutorials_spec_learns(plugin: Path, tmp_path: Path) -> None:
    """The spec docs/tutorials/plugins.md tells a reader to submit trains a model that beats
    chance clearly, as the page says; at AdamW's default learning rate it did not (0.03)."""
    page = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "plugins.md"
    [text] = [
        t for t in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S) if "max_steps" in t
    ]
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(text)
    spec = parse_spec({**load_spec_file(spec_file), "device": "cpu"})
    sink = ListSink()
    Trainer(spec, RunContext(str(tmp_path / "ckpt"), sink=sink)).train()
    [final] = [r for r in sink.items if r["kind"] == "eval"][-1:]
    chance = 1 / 3
    assert final["values"]["accuracy"] > 2 * chance
