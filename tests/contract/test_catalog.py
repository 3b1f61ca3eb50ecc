"""The torch-free catalog: listing, validation, and agreement with the real builders."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from typing import Any

import pytest

from amptrain.contract import catalog
from amptrain.contract.catalog import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    REQUIRED,
    validate_components,
)
from amptrain.contract.spec import ComponentRef, parse_spec


def _spec(model: dict[str, Any], dataset: dict[str, Any]) -> Any:
    return parse_spec({"model": model, "dataset": dataset, "max_steps": 1})


def test_importing_and_using_the_catalog_does_not_import_torch() -> None:
    code = (
        "import sys, json\n"
        "from amptrain.contract.catalog import catalog, validate_components\n"
        "from amptrain.contract.spec import parse_spec\n"
        "json.dumps(catalog())\n"
        "validate_components(parse_spec({'model': {'name': 'cnn'}, 'dataset': {'name': 'synthetic-images'},"
        " 'max_steps': 1}))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_catalog_lists_builtins_with_args_and_defaults() -> None:
    cat = catalog.catalog()
    assert {"mlp", "cnn", "transformer"} <= set(cat["models"])
    assert set(cat["datasets"]) >= {
        "synthetic-classification",
        "synthetic-images",
        "synthetic-text",
        "tensors",
    }
    assert set(cat["optimizers"]) == {"adamw", "sgd"}
    assert set(cat["schedules"]) == {"cosine", "linear", "constant"}
    assert set(cat["precisions"]) == {"auto", "fp32", "tf32", "fp16", "bf16"}
    width = next(a for a in cat["models"]["mlp"]["args"] if a["name"] == "width")
    assert width == {**width, "type": "int", "default": 256, "required": False}
    path = next(a for a in cat["datasets"]["tensors"]["args"] if a["name"] == "path")
    assert path["required"] and path["default"] is None
    lr = cat["optimizers"]["adamw"]["args"][0]
    assert lr["name"] == "lr" and lr["default"] == 1e-3 and lr["help"]


def test_resnet50_is_torchvisions_and_offered_only_where_torchvision_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert catalog.builtins("model")["resnet50"].requires == ("torchvision",)
    assert validate_components(_spec({"name": "resnet50"}, {"name": "synthetic-images"})) == []
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "torchvision" else real(name)
    )
    models = catalog.catalog()["models"]
    assert "resnet50" not in models and "vit_b_16" not in models and "timm" in models
    errors = validate_components(_spec({"name": "resnet50"}, {"name": "synthetic-images"}))
    assert errors[0]["loc"] == ["model", "name"]
    assert "(resnet50 needs torchvision, which is not installed)" in errors[0]["msg"]
    # The API's image has no torch (it never trains): it offers what the workers build.
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name.startswith("torch") else real(name)
    )
    assert "resnet50" in catalog.catalog()["models"]
    assert validate_components(_spec({"name": "resnet50"}, {"name": "synthetic-images"})) == []


def test_a_builtin_whose_requirement_is_missing_says_what_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needy = catalog.Registration(
        "needy", "model", "x:y", "Needs a module nobody has.", (), requires=("no_such_mod_xyz",)
    )
    monkeypatch.setattr(catalog, "BUILTIN_MODELS", (*BUILTIN_MODELS, needy))
    assert "needy" not in catalog.catalog()["models"]
    errors = validate_components(_spec({"name": "needy"}, {"name": "synthetic-images"}))
    assert errors[0]["loc"] == ["model", "name"]
    assert "needs no_such_mod_xyz, which is not installed" in errors[0]["msg"]


def test_a_good_spec_has_no_errors() -> None:
    for model, data in [
        ("mlp", "synthetic-classification"),
        ("mlp", "synthetic-images"),
        ("cnn", "synthetic-images"),
        ("transformer", "synthetic-text"),
    ]:
        assert validate_components(_spec({"name": model}, {"name": data})) == []


def test_unknown_names_are_named_with_the_registered_ones() -> None:
    errors = validate_components(_spec({"name": "foo"}, {"name": "bar"}))
    assert errors[0]["loc"] == ["model", "name"]
    assert errors[0]["msg"].startswith("unknown model 'foo'; registered: mlp, cnn, transformer, ")
    assert errors[1]["loc"] == ["dataset", "name"]
    assert "unknown dataset 'bar'" in errors[1]["msg"] and "synthetic-text" in errors[1]["msg"]


def test_bad_arguments_name_the_field() -> None:
    errors = validate_components(
        _spec(
            {"name": "mlp", "args": {"widht": 3, "depth": "2"}},
            {"name": "synthetic-images", "args": {"height": 1}},
        )
    )
    assert {
        "loc": ["model", "args", "widht"],
        "msg": "unexpected argument; allowed: depth, dropout, width",
    } in errors
    assert {"loc": ["model", "args", "depth"], "msg": "expected int, got str '2'"} in errors
    assert {"loc": ["dataset", "args", "height"], "msg": "must be >= 4; got 1"} in errors
    assert len(errors) == 3


def test_required_argument_and_choices() -> None:
    errors = validate_components(
        _spec({"name": "mlp"}, {"name": "tensors", "args": {"task": "regression"}})
    )
    locs = {tuple(e["loc"]): e["msg"] for e in errors}
    assert locs[("dataset", "args", "path")] == "required argument missing"
    assert locs[("dataset", "args", "task")].startswith(
        "must be one of classification, language_model"
    )


def test_booleans_are_not_integers_but_integers_are_floats() -> None:
    assert (
        validate_components(
            _spec({"name": "mlp", "args": {"dropout": 0}}, {"name": "synthetic-classification"})
        )
        == []
    )
    errors = validate_components(
        _spec({"name": "mlp", "args": {"width": True}}, {"name": "synthetic-classification"})
    )
    assert errors == [{"loc": ["model", "args", "width"], "msg": "expected int, got bool True"}]


def test_model_and_dataset_must_fit_together() -> None:
    errors = validate_components(_spec({"name": "transformer"}, {"name": "synthetic-images"}))
    assert errors == [
        {
            "loc": ["model", "name"],
            "msg": "model 'transformer' takes tokens, but dataset 'synthetic-images' yields images",
        }
    ]
    errors = validate_components(
        _spec(
            {"name": "cnn"},
            {"name": "tensors", "args": {"path": "x.npz", "task": "language_model"}},
        )
    )
    assert errors and "yields tokens" in errors[0]["msg"]


_CONTEXT_PARAMS = {"model": {"info"}, "dataset": {"seed", "data_roots"}}


@pytest.mark.parametrize("reg", [*BUILTIN_MODELS, *BUILTIN_DATASETS], ids=lambda r: r.name)
def test_catalog_args_match_the_builder_signatures(reg: catalog.Registration) -> None:
    """The catalog is hand-declared (torch-free); this keeps it from drifting from the code."""
    params = inspect.signature(reg.resolve_builder()).parameters
    real = {n: p.default for n, p in params.items() if n not in _CONTEXT_PARAMS[reg.kind]}
    declared = {a.name: a.default for a in reg.args}
    assert list(real) == list(declared)
    for name, default in declared.items():
        if default is REQUIRED:
            assert real[name] is inspect.Parameter.empty, name
        else:
            assert real[name] == default and type(real[name]) is type(default), name
    assert set(params) >= _CONTEXT_PARAMS[reg.kind]


def test_arguments_are_checked_against_one_another() -> None:
    """A transformer whose n_heads does not divide d_model was admitted and failed on the
    worker (a view of the attention heads)."""
    spec = parse_spec(
        {
            "model": {"name": "transformer", "args": {"d_model": 130, "n_heads": 4}},
            "dataset": {"name": "synthetic-text"},
            "max_steps": 1,
        }
    )
    (problem,) = validate_components(spec)
    assert problem["loc"] == ["model", "args", "n_heads"]
    assert problem["msg"] == "must divide d_model (130); got 4"
    fine = spec.model_copy(
        update={"model": ComponentRef(name="transformer", args={"d_model": 128})}
    )
    assert validate_components(fine) == []  # n_heads 4 by default
