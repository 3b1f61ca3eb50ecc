"""Bounds on every number and string of a job spec: what a hostile or careless user sends
is refused naming the field, and the bounds are documented (schema and catalog)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from amptrain.contract.catalog import catalog, validate_components
from amptrain.contract.limits import spec_limits
from amptrain.contract.spec import JobSpec, parse_spec

BASE: dict[str, Any] = {
    "model": {"name": "mlp"},
    "dataset": {"name": "synthetic-classification"},
    "max_steps": 10,
}


def _with(path: str, value: Any, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """``spec`` (default BASE) with the dotted ``path`` set to ``value``."""
    out = json.loads(json.dumps(spec or BASE))
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def _refused(data: dict[str, Any]) -> set[str]:
    """The fields named by the spec's own validation and the catalog's component checks."""
    try:
        spec = parse_spec(data)
    except ValidationError as exc:
        return {".".join(str(p) for p in e["loc"]) for e in exc.errors()}
    return {".".join(e["loc"]) for e in validate_components(spec)}


# The values the hostile user sent, each accepted with 201 before.
@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("batch_size", 1e30, "batch_size"),
        ("batch_size", 10**30, "batch_size"),
        ("model.args.width", 10**12, "model.args.width"),
        ("seed", 1e30, "seed"),
        ("seed", 2**64, "seed"),
        ("max_steps", 10**15, "max_steps"),
        ("max_steps", 2**31, "max_steps"),  # past PostgreSQL's int4 columns
        ("checkpoint.keep_last", 10**9, "checkpoint.keep_last"),
        ("checkpoint.every_steps", 10**12, "checkpoint.every_steps"),
        ("grad_accum_steps", 10**9, "grad_accum_steps"),
        ("optimizer.lr", 1e300, "optimizer.lr"),
        ("telemetry.flush_every_ms", 10**12, "telemetry.flush_every_ms"),
        ("telemetry.queue_size", 10**12, "telemetry.queue_size"),
        ("schedule.warmup_steps", 10**15, "schedule.warmup_steps"),
        ("max_runtime_s", 10**12, "max_runtime_s"),
        ("max_runtime_s", 0, "max_runtime_s"),
        # The numerics guardian's knobs.
        ("health.loss_scale_floor_steps", 10**15, "health.loss_scale_floor_steps"),
        ("health.max_consecutive_skips", 2**31, "health.max_consecutive_skips"),
        ("health.max_consecutive_skips", 0, "health.max_consecutive_skips"),
        ("health.fallback", "bf16; rm -rf /", "health.fallback"),
        ("health.spike.max_rollbacks", 10**9, "health.spike.max_rollbacks"),
        ("telemetry.layer_grad_norms_every", 10**12, "telemetry.layer_grad_norms_every"),
        ("telemetry.layer_grad_norms_every", 0, "telemetry.layer_grad_norms_every"),
        # A promise of bitwise results takes true or false only (pydantic's lax bool would
        # read each of these as a bool).
        ("deterministic", "yes", "deterministic"),
        ("deterministic", "false", "deterministic"),
        ("deterministic", 1, "deterministic"),
        ("deterministic", 0.0, "deterministic"),
        ("deterministic", None, "deterministic"),
    ],
)
def test_huge_numbers_are_refused_naming_the_field(path: str, value: Any, field: str) -> None:
    assert _refused(_with(path, value)) == {field}


@pytest.mark.parametrize(
    ("dataset", "args", "field"),
    [
        ("synthetic-images", {"height": 100_000, "width": 100_000}, {"height", "width"}),
        ("synthetic-text", {"seq_len": 10**9}, {"seq_len"}),
        ("synthetic-text", {"vocab_size": 10**9}, {"vocab_size"}),
        ("synthetic-classification", {"num_samples": 10**11}, {"num_samples"}),
        ("synthetic-classification", {"data_seed": 10**30}, {"data_seed"}),
        ("synthetic-classification", {"feature_scale": 1e300}, {"feature_scale"}),
        ("synthetic-classification", {"feature_scale": 0.0}, {"feature_scale"}),
        ("tensors", {"path": "x.npz", "num_classes": 10**12}, {"num_classes"}),
        ("tensors", {"path": "x" * 5000}, {"path"}),
    ],
)
def test_dataset_arguments_have_upper_bounds(
    dataset: str, args: dict[str, Any], field: set[str]
) -> None:
    model = "transformer" if dataset == "synthetic-text" else "mlp"
    data = {**BASE, "model": {"name": model}, "dataset": {"name": dataset, "args": args}}
    assert _refused(data) == {f"dataset.args.{f}" for f in field}


def _schema_fields(*types: str) -> list[str]:
    """Every field of the spec whose JSON-schema type is one of ``types``, by dotted path,
    found in the schema itself (so a new one is covered too)."""
    schema = JobSpec.model_json_schema()
    defs = schema["$defs"]
    found = []

    def walk(node: dict[str, Any], path: str) -> None:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        for option in node.get("anyOf", ()):
            walk(option, path)
        if node.get("type") in types:
            found.append(path)
        for i, item in enumerate(node.get("prefixItems", ())):
            walk(item, f"{path}.{i}")
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}" if path else name)

    walk(schema, "")
    return sorted(set(found))


FLOAT_FIELDS = _schema_fields("number")


def test_the_float_fields_are_found() -> None:
    assert {
        "optimizer.lr",
        "optimizer.betas.0",
        "grad_clip_norm",
        "health.warn_loss_scale_below",
    } <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("path", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_in_every_float_field(path: str, value: float) -> None:
    if path.startswith("optimizer.betas."):
        betas = [0.9, 0.999]
        betas[int(path[-1])] = value
        data = _with("optimizer.betas", betas)
    else:
        data = _with(path, value)
    with pytest.raises(ValidationError) as err:
        parse_spec(data)
    locs = {".".join(str(p) for p in e["loc"]) for e in err.value.errors()}
    assert locs == {path}


def test_nan_travels_through_json_and_is_still_refused() -> None:
    # What an HTTP client sends: Python's json writes (and reads) the bare NaN token.
    body = json.dumps(_with("optimizer.lr", math.nan))
    assert "NaN" in body
    with pytest.raises(ValidationError, match="finite number"):
        JobSpec.model_validate_json(body)


def test_component_arguments_refuse_nan_and_infinity() -> None:
    for value in (math.nan, math.inf):
        assert _refused(_with("model.args.dropout", value)) == {"model.args.dropout"}
    plugin_style = _with("dataset.args", {"nested": {"deep": [1.0, math.inf]}})
    assert _refused(plugin_style) == {"dataset.args.nested"}


@pytest.mark.parametrize(
    ("optimizer", "field"),
    [
        ({"betas": [5, 5]}, {"optimizer.betas.0", "optimizer.betas.1"}),
        ({"betas": [0.9, 1.0]}, {"optimizer.betas.1"}),
        ({"betas": [-0.1, 0.9]}, {"optimizer.betas.0"}),
        ({"betas": [0.9]}, {"optimizer.betas.1"}),
        ({"eps": 0}, {"optimizer.eps"}),
        ({"eps": -1e-8}, {"optimizer.eps"}),
        ({"momentum": 1.0, "name": "sgd"}, {"optimizer.momentum"}),
    ],
)
def test_adamw_betas_and_eps_are_checked(optimizer: dict[str, Any], field: set[str]) -> None:
    assert _refused(_with("optimizer", optimizer)) == field


def test_deterministic_is_off_by_default_and_takes_a_json_bool() -> None:
    assert parse_spec(BASE).deterministic is False
    assert parse_spec(_with("deterministic", True)).deterministic is True
    body = json.dumps(_with("deterministic", True))
    assert JobSpec.model_validate_json(body).deterministic is True
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate_json(json.dumps(_with("deterministic", "true")))
    assert [e["loc"] for e in err.value.errors()] == [("deterministic",)]


def test_good_betas_and_eps_pass() -> None:
    spec = parse_spec(_with("optimizer", {"betas": [0.0, 0.95], "eps": 1e-6}))
    assert spec.optimizer.betas == (0.0, 0.95) and spec.optimizer.eps == 1e-6


@pytest.mark.parametrize(
    "name",
    [
        "evil\x1b[2J\x1b[Hname",  # clears a colleague's terminal
        "line\nbreak",
        "tab\there",
        "bell\x07",
        "null\x00",
        "spoof\u202etxt.exe",  # right-to-left override
        "zero\u200bwidth",
        "sep\u2028line",
    ],
)
def test_job_names_refuse_control_and_formatting_characters(name: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_spec({**BASE, "name": name})
    (error,) = err.value.errors()
    assert error["loc"] == ("name",) and "control or formatting characters" in error["msg"]


def test_names_with_ordinary_unicode_pass_and_length_is_bounded() -> None:
    assert parse_spec({**BASE, "name": "résumé: 学习 👩‍💻 run #3"}).name.startswith("résumé")
    assert _refused({**BASE, "name": "x" * 201}) == {"name"}


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("model.name", "mlp\x1b", "model.name"),
        ("model.name", "m" * 101, "model.name"),
        ("dataset.args", {"path": "x.npz\nrm -rf"}, "dataset.args.path"),
        ("dataset.args", {"path": "x.npz", "inputs_key": "k\x1b[31m"}, "dataset.args.inputs_key"),
        ("dataset.args", {"free": "text\x1b"}, "dataset.args.free"),  # plugin-style argument
        ("dataset.args", {"bad name": 1}, "dataset.args.bad name.[key]"),
        ("dataset.args", {f"a{i}": i for i in range(65)}, "dataset.args"),
    ],
)
def test_other_free_text_is_checked_too(path: str, value: Any, field: str) -> None:
    data = _with(path, value)
    if path == "dataset.args" and "path" in value:
        data["dataset"]["name"] = "tensors"
    assert field in _refused(data)


def test_error_messages_quote_only_a_prefix_of_a_bad_value() -> None:
    data = {**BASE, "dataset": {"name": "tensors", "args": {"path": "p.npz", "task": "z" * 3000}}}
    spec = parse_spec(data)
    (problem,) = validate_components(spec)
    assert problem["loc"] == ["dataset", "args", "task"] and len(problem["msg"]) < 200


def test_every_number_in_the_schema_has_both_bounds() -> None:
    """A new unbounded numeric field fails here: bounds are part of adding a field."""
    limits = spec_limits()
    numeric = _schema_fields("number", "integer")
    assert len(numeric) > 25
    for path in numeric:
        bounds = limits.get(path, {})
        assert {"minimum", "exclusive_minimum"} & set(bounds), path
        assert {"maximum", "exclusive_maximum"} & set(bounds), path


def test_the_catalog_documents_spec_and_argument_bounds() -> None:
    cat = catalog()
    assert cat["limits"]["max_steps"] == {"minimum": 1, "maximum": 10_000_000}
    assert cat["limits"]["max_steps"]["maximum"] < 2**31  # fits PostgreSQL int4
    assert cat["limits"]["optimizer.betas.1"] == {"minimum": 0, "exclusive_maximum": 1}
    adamw = {a["name"]: a for a in cat["optimizers"]["adamw"]["args"]}
    assert adamw["eps"]["limits"] == {"exclusive_minimum": 0, "maximum": 1}
    assert adamw["betas"]["limits"]["optimizer.betas.0"]["exclusive_maximum"] == 1
    for section in ("models", "datasets"):
        for name, entry in cat[section].items():
            for arg in entry["args"]:
                if arg["type"] in ("int", "float") and arg["choices"] is None:
                    assert arg["minimum"] is not None and arg["maximum"] is not None, (name, arg)
                if arg["type"] == "str":
                    assert arg["max_length"], (name, arg)
