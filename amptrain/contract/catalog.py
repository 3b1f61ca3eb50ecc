"""What can be trained: the registered models, datasets, optimizers and schedules.

Torch-free on purpose: the API lists and validates components with this module
and must never import torch (``tests/contract/test_catalog.py`` checks it). The torch
side lives in ``amptrain.components.registry`` and ``amptrain.components``; it
builds from the very same :class:`Registration` objects (``amptrain.contract.registration``), so the
catalog, validation and construction cannot disagree about names or arguments.

Plugins
-------
Other packages add components through entry points in the groups
``amptrain.models`` and ``amptrain.datasets``, and evaluation metrics through
``amptrain.metrics``. Each entry point names a :class:`Registration` object (a
:class:`~amptrain.contract.registration.MetricRegistration` for a metric); keep the module it lives in torch-free and point
``builder`` at the torch code with a ``"module:attribute"`` string, so loading the
registration stays cheap. The catalog lists plugins by entry-point name without
importing them; the registry loads them when a job uses one. See
``amptrain/components/README.md`` and ``tests/plugins/amptrain_example_plugin``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from amptrain.contract import metrics
from amptrain.contract.builtins import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    OPTIMIZERS,
    PRECISIONS,
    SCHEDULES,
)
from amptrain.contract.eval_choice import (
    EVAL_CHOICES,
    inapplicable,
    inapplicable_message,
    task_of,
)
from amptrain.contract.limits import spec_limits
from amptrain.contract.registration import (
    DATASET_GROUP,
    METRIC_GROUP,
    MODEL_GROUP,
    REQUIRED,
    Arg,
    DataKind,
    MetricRegistration,
    Registration,
)
from amptrain.contract.spec import ComponentRef, JobSpec, OptimizerSpec, ScheduleSpec


def builtins(kind: Literal["model", "dataset"]) -> dict[str, Registration]:
    """The built-in registrations of ``kind`` available here (one whose ``requires`` is missing is not)."""
    regs = BUILTIN_MODELS if kind == "model" else BUILTIN_DATASETS
    return {r.name: r for r in regs if r.available()}


PluginKind = Literal["model", "dataset", "metric"]
_GROUPS: dict[PluginKind, str] = {
    "model": MODEL_GROUP,
    "dataset": DATASET_GROUP,
    "metric": METRIC_GROUP,
}


def _builtin_names(kind: PluginKind) -> set[str]:
    if kind == "metric":
        return set(EVAL_CHOICES)
    return {r.name for r in (BUILTIN_MODELS if kind == "model" else BUILTIN_DATASETS)}


def plugin_entry_points(kind: PluginKind) -> dict[str, EntryPoint]:
    """Installed plugin entry points of ``kind`` by name; built-in names cannot be overridden."""
    taken = _builtin_names(kind)
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=_GROUPS[kind]):
        if ep.name not in taken:
            found.setdefault(ep.name, ep)
    return found


def registered_names(kind: Literal["model", "dataset"]) -> list[str]:
    return [*builtins(kind), *plugin_entry_points(kind)]


def _field_help(
    spec: type[OptimizerSpec] | type[ScheduleSpec], section: str, name: str
) -> dict[str, Any]:
    f = spec.model_fields[name]
    default = f.default
    limits = spec_limits()
    bounds = limits.get(f"{section}.{name}") or {
        k: v for k, v in limits.items() if k.startswith(f"{section}.{name}.")
    }
    return {
        "name": name,
        "default": list(default) if isinstance(default, tuple) else default,
        "help": f.description,
        "limits": bounds,
    }


def catalog() -> dict[str, Any]:
    """Everything a job spec can name, with arguments, defaults and descriptions, and the
    metrics a job records with the charts that show them (JSON-ready).

    Plugins appear by entry-point name with ``source: "plugin"`` and the entry
    point's target; they are not imported, so their arguments are not listed.
    """

    def section(kind: Literal["model", "dataset"]) -> dict[str, Any]:
        out = {name: r.describe("builtin") for name, r in builtins(kind).items()}
        for name, ep in plugin_entry_points(kind).items():
            out[name] = {"name": name, "source": "plugin", "entry_point": ep.value, "args": None}
        return out

    plugin_metrics = [
        {"name": name, "source": "plugin", "entry_point": ep.value}
        for name, ep in plugin_entry_points("metric").items()
    ]
    listed = metrics.catalog()
    listed["eval_metrics"] += plugin_metrics
    return {
        "models": section("model"),
        "datasets": section("dataset"),
        "optimizers": {
            name: {
                "name": name,
                "description": d,
                "args": [_field_help(OptimizerSpec, "optimizer", a) for a in args],
            }
            for name, (d, args) in OPTIMIZERS.items()
        },
        "schedules": {
            name: {
                "name": name,
                "description": d,
                "args": [
                    _field_help(ScheduleSpec, "schedule", a)
                    for a in ("warmup_steps", "min_lr_ratio")
                ],
            }
            for name, d in SCHEDULES.items()
        },
        "precisions": {name: {"name": name, "description": d} for name, d in PRECISIONS.items()},
        "limits": spec_limits(),
        **listed,
    }


def _error(loc: Sequence[str], msg: str) -> dict[str, Any]:
    return {"loc": list(loc), "msg": msg}


def component_errors(
    field_name: str, kind: Literal["model", "dataset"], name: str, args: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], Registration | None]:
    regs = builtins(kind)
    if name in regs:
        reg = regs[name]
        return [_error((field_name, "args", a), m) for a, m in reg.arg_errors(args)], reg
    if name in plugin_entry_points(kind):
        return [], None  # a plugin checks its own arguments when it is built
    hint = ""
    missing = [
        r for r in (BUILTIN_MODELS if kind == "model" else BUILTIN_DATASETS) if r.name == name
    ]
    if missing:
        hint = f" ({name} needs {', '.join(missing[0].requires)}, which is not installed)"
    known = ", ".join(registered_names(kind))
    return [
        _error((field_name, "name"), f"unknown {kind} {name!r}{hint}; registered: {known}")
    ], None


def validate_components(spec: JobSpec) -> list[dict[str, Any]]:
    """Problems with the spec's model and dataset, as ``{"loc": [...], "msg": ...}``; empty = fine.

    Checks names, argument names, types and ranges, that the model can consume what the
    dataset yields, and that the dataset's task gives each built-in metric ``eval.metrics``
    names (where its kind is declared). Plugins' arguments are checked when they are built.
    """
    errors = validate_refs(spec.model, spec.dataset)
    task = _dataset_task(spec.dataset) if spec.eval.metrics else None
    refused = inapplicable(spec.eval.metrics, task) if task else []
    if task and refused:
        errors.append(_error(("eval", "metrics"), inapplicable_message(refused, task)))
    return errors


def _dataset_task(ref: ComponentRef) -> metrics.Task | None:
    """The task of the dataset ``ref``, where known before it is built."""
    data = builtins("dataset").get(ref.name)
    if data is None:
        return None  # unknown (already an error) or a plugin's (the worker checks it)
    if data.name == "tensors":
        lm = ref.args.get("task") == "language_model"
        return "language_model" if lm else "classification"
    return task_of(data.provides)


_TENSORS_KINDS: dict[Any, DataKind] = {
    "language_model": "tokens",
    "sequence_classification": "sequences",
}
"""What the ``tensors`` dataset yields by task (classification: vectors or images, by the
file's shape, so only the worker can say)."""


def validate_refs(
    model_ref: ComponentRef | None, dataset_ref: ComponentRef | None
) -> list[dict[str, Any]]:
    """Like :func:`validate_components` for whichever refs are known (e.g. when another
    part of the spec failed to parse, so every problem can be reported at once)."""
    errors: list[dict[str, Any]] = []
    model = data = None
    if model_ref is not None:
        found, model = component_errors("model", "model", model_ref.name, model_ref.args)
        errors += found
    if dataset_ref is not None:
        found, data = component_errors("dataset", "dataset", dataset_ref.name, dataset_ref.args)
        errors += found
    provides = data.provides if data is not None else None
    if data is not None and data.name == "tensors" and dataset_ref:
        provides = _TENSORS_KINDS.get(dataset_ref.args.get("task", "classification"))
    if (
        model is not None
        and provides is not None
        and model.accepts
        and provides not in model.accepts
    ):
        assert dataset_ref is not None
        errors.append(
            _error(
                ("model", "name"),
                f"model {model.name!r} takes {' or '.join(model.accepts)}, but dataset "
                f"{dataset_ref.name!r} yields {provides}",
            )
        )
    if not errors and model is not None and data is not None:
        assert model_ref is not None and dataset_ref is not None
        errors += _shape_errors(model, model_ref, data, dataset_ref)
    return errors


def _shape_errors(
    model: Registration, model_ref: ComponentRef, data: Registration, dataset_ref: ComponentRef
) -> list[dict[str, Any]]:
    """The model's refusal of the dataset's sample shape, when both declare theirs (so a
    job the worker would refuse is refused at submit)."""
    if model.fits is None or data.footprint is None:
        return []
    shape = data.footprint(data.with_defaults(dataset_ref.args))
    if shape is None:
        return []
    problem = model.fits(shape.input_shape, model.with_defaults(model_ref.args))
    if not problem:
        return []
    yields = "x".join(map(str, shape.input_shape))
    return [
        _error(
            ("model", "name"),
            # The model's name unquoted: the API shortens any quoted stretch over 40
            # characters, and it cannot tell a closing quote from an opening one.
            f"model {model.name} {problem}, but dataset {dataset_ref.name!r} yields {yields}",
        )
    ]


__all__ = [
    "BUILTIN_DATASETS",
    "BUILTIN_MODELS",
    "DATASET_GROUP",
    "METRIC_GROUP",
    "MODEL_GROUP",
    "REQUIRED",
    "Arg",
    "MetricRegistration",
    "Registration",
    "catalog",
    "validate_components",
    "validate_refs",
]
