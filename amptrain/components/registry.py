"""Build the components a job spec names: models, datasets, losses, optimizers, schedules.

Names resolve to :class:`amptrain.contract.catalog.Registration` objects: the
built-ins declared in the catalog, then installed plugins (entry-point groups
``amptrain.models``, ``amptrain.datasets`` and, for evaluation metrics (a per-sample
function or a ``torchmetrics.Metric`` class), ``amptrain.metrics``; see
``amptrain/components/README.md``). Every problem with the spec raises
:class:`InvalidSpecError` naming the field, e.g.
``model.args.widht: unexpected argument; allowed: depth, dropout, width``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from torch import nn

from amptrain.components.base import DataInfo, Dataset
from amptrain.components.losses import loss_for
from amptrain.components.memory_budget import require_memory
from amptrain.components.optim import build_optimizer, lr_table
from amptrain.contract import catalog
from amptrain.contract.catalog import MetricRegistration, Registration
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import ComponentRef

Kind = Literal["model", "dataset"]

__all__ = [
    "build_dataset",
    "build_model",
    "build_optimizer",
    "loss_for",
    "lr_table",
    "metric_class",
    "metric_registration",
    "registration",
]


def _load_plugin(kind: catalog.PluginKind, name: str) -> Any:
    field = "eval.metrics" if kind == "metric" else f"{kind}.name"
    ep = catalog.plugin_entry_points(kind)[name]
    try:
        reg = ep.load()
    except Exception as exc:  # a broken plugin is reported, not crashed on
        raise InvalidSpecError(
            f"{field}: plugin {name!r} ({ep.value}) failed to load: {exc!r}"
        ) from exc
    expected = MetricRegistration if kind == "metric" else Registration
    if not isinstance(reg, expected) or getattr(reg, "kind", kind) != kind:
        raise InvalidSpecError(
            f"{field}: plugin entry point {name!r} ({ep.value}) must point at a "
            f"amptrain.contract.catalog.{expected.__name__}"
            f"{'' if kind == 'metric' else f' of kind {kind!r}'}, not {reg!r}"
        )
    if reg.name != name:
        raise InvalidSpecError(
            f"{field}: plugin entry point {name!r} points at a registration named {reg.name!r}"
        )
    return reg


def metric_registration(name: str) -> MetricRegistration:
    """The installed plugin metric ``name`` (built-in metrics need no registration)."""
    if name not in catalog.plugin_entry_points("metric"):
        raise InvalidSpecError(f"eval.metrics: no installed plugin registers metric {name!r}")
    reg: MetricRegistration = _load_plugin("metric", name)
    return reg


def metric_class(reg: MetricRegistration) -> type | None:
    """The ``torchmetrics.Metric`` subclass a plugin metric's ``compute`` names, or None
    when it names a per-sample function; InvalidSpecError for any other class."""
    target = reg.resolve_compute()
    if not isinstance(target, type):
        return None
    from torchmetrics import Metric  # only for a plugin naming a class: it loads slowly

    if not issubclass(target, Metric):
        raise InvalidSpecError(
            f"eval.metrics: metric {reg.name!r} names the class {target.__name__}, which is "
            f"not a torchmetrics.Metric (or name a per-sample function)"
        )
    return target


def registration(kind: Kind, name: str) -> Registration:
    """The registration for ``name``: a built-in, else an installed plugin."""
    builtins = catalog.builtins(kind)
    if name in builtins:
        return builtins[name]
    if name in catalog.plugin_entry_points(kind):
        return _load_plugin(kind, name)
    errors = catalog.component_errors(kind, kind, name, {})[0]
    raise InvalidSpecError(f"{kind}.name: {errors[0]['msg']}")


def _checked_args(kind: Kind, reg: Registration, ref: ComponentRef) -> dict[str, object]:
    errors = reg.arg_errors(ref.args)
    if errors:
        raise InvalidSpecError("; ".join(f"{kind}.args.{arg}: {msg}" for arg, msg in errors))
    return reg.with_defaults(ref.args)


def build_dataset(ref: ComponentRef, *, seed: int, data_roots: Sequence[str] = ()) -> Dataset:
    """The dataset ``ref`` names, seeded; file datasets may only read under ``data_roots``."""
    reg = registration("dataset", ref.name)
    args = _checked_args("dataset", reg, ref)
    # Before a byte is allocated: a dataset that declares its size must fit (file datasets
    # check what their headers declare as they open the file).
    shape = reg.footprint(args) if reg.footprint is not None else None
    if shape is not None:
        require_memory(shape.resident_bytes, f"the dataset {ref.name!r}")
    dataset = reg.resolve_builder()(seed=seed, data_roots=tuple(data_roots), **args)
    if not isinstance(getattr(dataset, "info", None), DataInfo) or not callable(
        getattr(dataset, "batch", None)
    ):
        raise InvalidSpecError(
            f"dataset.name: {ref.name!r} built {type(dataset).__name__}, which lacks info: DataInfo or batch()"
        )
    return dataset


def build_model(ref: ComponentRef, info: DataInfo) -> nn.Module:
    """The model ``ref`` names, sized for ``info`` (parameters fp32, on the CPU)."""
    reg = registration("model", ref.name)
    args = _checked_args("model", reg, ref)
    if reg.accepts and info.kind not in reg.accepts:
        raise InvalidSpecError(
            f"model.name: model {ref.name!r} takes {' or '.join(reg.accepts)}, but the dataset yields "
            f"{info.kind} of shape {info.input_shape}"
        )
    problem = reg.fits(info.input_shape, args) if reg.fits is not None else None
    if problem:
        raise InvalidSpecError(
            f"model.name: model {ref.name} {problem}, but the dataset yields {info.kind} "
            f"of shape {'x'.join(map(str, info.input_shape))}"
        )
    model = reg.resolve_builder()(info, **args)
    if not isinstance(model, nn.Module):
        raise InvalidSpecError(
            f"model.name: {ref.name!r} built {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def builder_of(kind: Kind, name: str) -> Callable[..., object]:
    """The builder function behind ``name`` (for tests comparing signatures with the catalog)."""
    return registration(kind, name).resolve_builder()
