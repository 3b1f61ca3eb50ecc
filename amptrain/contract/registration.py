"""How a component declares itself: :class:`Registration` and its :class:`Arg` list.

Torch-free. Built-ins (``amptrain.contract.catalog``) and plugins (entry points in
the groups below) use the same objects, so the catalog, validation and the
registry's construction cannot disagree about names or arguments.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from amptrain.contract.metrics import EVAL_BY_NAME, Task, check_series_name
from amptrain.contract.sizing import DataShape
from amptrain.contract.text import control_character, finite, quote

MODEL_GROUP = "amptrain.models"
DATASET_GROUP = "amptrain.datasets"
METRIC_GROUP = "amptrain.metrics"

ArgType = Literal["int", "float", "bool", "str"]
# What a dataset yields per sample, and so what a model can consume: ``tokens`` are a
# language model's (token ids, next token ids); ``sequences`` token ids with one class label.
DataKind = Literal["vectors", "images", "tokens", "sequences"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Default of an argument the user must give (e.g. the path of a file dataset)."""

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
}


@dataclass(frozen=True)
class Arg:
    """One keyword argument of a component builder."""

    name: str
    default: Any
    help: str
    type: ArgType | None = None
    """Inferred from ``default`` when omitted (required arguments must give it)."""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    max_length: int = 1024
    """Strings only: longest accepted value."""
    path: bool = False
    """Strings only: a file location (or a shard pattern) under the service's data roots.
    The API checks it against them as text at submit, the worker again before it opens
    anything: every file reader's path argument says so, so none is left unchecked."""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def kind(self) -> ArgType:
        if self.type is not None:
            return self.type
        for name in ("bool", "int", "float", "str"):  # bool before int: True is an int
            if type(self.default) in _PY_TYPES[name]:
                return name
        raise TypeError(f"argument {self.name!r}: give type= for default {self.default!r}")

    def check(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable, or None when it is."""
        kind = self.kind
        if (isinstance(value, bool) and kind != "bool") or not isinstance(value, _PY_TYPES[kind]):
            return f"expected {kind}, got {type(value).__name__} {quote(value)}"
        if not finite(value):
            return f"must be a finite number; got {value!r}"
        if isinstance(value, str):
            if len(value) > self.max_length:
                return f"at most {self.max_length} characters; got {len(value)}"
            problem = control_character(value)
            if problem:
                return problem
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}; got {quote(value)}"
        number: Any = value  # int, float or str by now; only numbers carry bounds
        if self.minimum is not None and number < self.minimum:
            return f"must be >= {_num(self.minimum)}; got {quote(value)}"
        if self.maximum is not None and number > self.maximum:
            return f"must be <= {_num(self.maximum)}; got {quote(value)}"
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.kind,
            "default": None if self.required else self.default,
            "required": self.required,
            "choices": list(self.choices) if self.choices is not None else None,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "max_length": self.max_length if self.kind == "str" else None,
            "help": self.help,
        }


def _resolve(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """A callable, or the one a lazy ``"module:attribute"`` reference names (imported now)."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def _num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


@dataclass(frozen=True)
class Registration:
    """A model or dataset that amptrain can build by name.

    ``builder`` is a callable or a lazy ``"module:attribute"`` reference to one.
    Model builders are called as ``builder(info, **args)`` with a
    ``amptrain.components.base.DataInfo`` and return a ``torch.nn.Module``
    whose ``forward(inputs)`` returns logits. Dataset builders are called as
    ``builder(seed=..., data_roots=..., **args)`` and return an object with an
    ``info`` attribute and ``batch(start, size) -> (inputs, targets)``.
    """

    name: str
    kind: Literal["model", "dataset"]
    builder: str | Callable[..., Any]
    description: str
    args: tuple[Arg, ...] = ()
    accepts: tuple[DataKind, ...] = ()
    """Models: the data kinds they consume (empty = any)."""
    provides: DataKind | None = None
    """Datasets: the data kind they yield (None = depends on the arguments)."""
    requires: tuple[str, ...] = ()
    """Importable modules it needs; a process with torch offers it only when all are
    installed (see :meth:`available`)."""
    footprint: Callable[[Mapping[str, Any]], DataShape | None] | None = None
    """Datasets, optional: ``footprint(args)`` (defaults filled in) -> what one sample looks
    like and the host memory the dataset holds; see ``amptrain.contract.sizing``."""
    parameters: Callable[[DataShape, Mapping[str, Any]], int] | None = None
    """Models, optional: ``parameters(data, args)`` -> the exact parameter count."""
    fits: Callable[[tuple[int, ...], Mapping[str, Any]], str | None] | None = None
    """Models, optional: ``fits(input_shape, args)`` -> why the model cannot take samples
    of that shape (``"takes 3-channel images"``), or None. Checked at submit when the
    dataset declares its footprint, else by the worker before building."""
    rules: Callable[[Mapping[str, Any]], list[tuple[str, str]]] | None = None
    """Optional: ``rules(args)`` (defaults filled in) -> ``(argument, message)`` for each
    way the arguments do not fit one another, checked once each is fine on its own (at
    submit for built-ins, so the worker never fails on what the API could have said)."""

    def available(self) -> bool:
        """Whether this process offers it: every module it ``requires`` is installed. A
        process without torch (the API's own image, which never trains) cannot tell and
        offers it: the workers' ``engine`` extra brings every built-in's library, and a
        worker that lacks one refuses the job naming the model and the module."""
        if importlib.util.find_spec("torch") is None:
            return True
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def resolve_builder(self) -> Callable[..., Any]:
        return _resolve(self.builder)

    def arg_errors(self, args: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(argument, message) for every problem with ``args``; empty when they are fine."""
        known = {a.name: a for a in self.args}
        allowed = ", ".join(sorted(known)) or "(none)"
        errors = [
            (name, f"unexpected argument; allowed: {allowed}") for name in args if name not in known
        ]
        for a in self.args:
            if a.name in args:
                problem = a.check(args[a.name])
                if problem:
                    errors.append((a.name, problem))
            elif a.required:
                errors.append((a.name, "required argument missing"))
        if not errors and self.rules is not None:
            errors = self.rules(self.with_defaults(args))
        return errors

    @property
    def path_args(self) -> tuple[str, ...]:
        """The names of the arguments that are file locations (``Arg.path``)."""
        return tuple(a.name for a in self.args if a.path)

    def with_defaults(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """``args`` completed with the defaults of the arguments not given."""
        return {a.name: args.get(a.name, a.default) for a in self.args}

    def describe(self, source: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "source": source,
            # The library that builds it (the first module it requires), else amptrain.
            "library": self.requires[0] if self.requires else "amptrain",
            "args": [a.describe() for a in self.args],
        }
        if self.kind == "model":
            out["accepts"] = list(self.accepts)
        else:
            out["provides"] = self.provides
        return out


@dataclass(frozen=True)
class MetricRegistration:
    """An evaluation metric a team defines, computed on the held-out split beside the
    built-in ones when a job lists its name in ``eval.metrics``.

    Its value is the mean over the evaluated held-out samples (tokens, for a language
    model) of what ``compute(logits, targets)`` returns per sample: ``compute`` is a
    callable or a lazy ``"module:attribute"`` reference to one, called without gradients
    with fp32 logits (``[N, classes]``, or ``[N, T, vocabulary]``) and the targets
    (``[N]`` or ``[N, T]``); it returns a tensor of the targets' shape. The engine sums it
    on the device, so a metric costs no host read of its own.

    Or ``compute`` names a ``torchmetrics.Metric`` class (a metric that is no such mean: an
    F1 over classes): built per job with ``num_classes`` when it takes it, updated per
    held-out micro-batch with fp32 logits, computed (gathered across data-parallel ranks by
    torchmetrics) at the end of each evaluation; see ``amptrain/components/README.md``.
    """

    name: str
    """The series name (lowercase letters, digits and ``_``; not a built-in's)."""
    compute: str | Callable[..., Any]
    description: str
    better: Literal["higher", "lower"]
    """Which way is an improvement."""
    tasks: tuple[Task, ...] = ("classification", "language_model")
    """The dataset tasks it applies to; a job of another task naming it fails (``invalid_spec``)."""

    def __post_init__(self) -> None:
        check_series_name(self.name)
        if self.name in EVAL_BY_NAME:
            raise ValueError(f"metric name {self.name!r} is a built-in evaluation metric")

    def resolve_compute(self) -> Callable[..., Any]:
        return _resolve(self.compute)
