"""The one table of metric definitions: every per-step field a job records, defined once.

Everything that names a step metric derives from :data:`STEP_METRICS`: the engine's
records (:mod:`amptrain.contract.records`), the stream encoding
(:mod:`amptrain.contract.stream`), the series stored in chunks
(:mod:`amptrain.store.history.chunk_parts`), the recorder's parsing, the job summary and its
API schema, the worker's presence and Prometheus gauges, ``GET /catalog``'s ``metrics``
(from which the dashboard draws its charts) and both command lines' progress lines.

Adding a built-in per-step field touches this table and the code that computes it (the
engine's :class:`~amptrain.engine.telemetry.StepTelemetry`): it is a series of its own in
the chunks, so no migration. Nothing in the API, the recorder, the dashboard or the
command lines changes.

Evaluation metrics (:data:`EVAL_METRICS`, and those plugins register) are the same
:class:`Metric`, recorded as *named series*: an ``eval`` record carries a name -> value
mapping (:func:`amptrain.contract.records.evaluation`), stored one row per value, so a
new evaluation metric needs no migration and no code in the API.

Torch-free and dependency-free: every process imports it.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from amptrain.contract.charts import CHARTS

MetricType = Literal["int", "float", "bool", "bytes", "ints"]
"""``bytes`` is an integer count of bytes (a 64-bit column); ``ints`` a list of integers."""


@dataclass(frozen=True)
class Metric:
    """One per-step field of a metric record."""

    name: str
    type: MetricType
    doc: str
    unit: str = ""
    """How a value reads: ``bytes``, ``samples/s``, ``ms``, ``s`` or nothing."""
    label: str = ""
    """A short label for progress lines (the name when empty)."""
    extremes: bool = False
    """It can spike: a downsampled history read keeps its per-bucket minimum and maximum
    (from its roll-ups), so it shows the spikes (``GET /jobs/{id}/metrics?fields=``). ``lr``
    follows a smooth schedule and ``memory_reserved``/``memory_peak`` only step up, so a
    bucket's first and last points already bound them; leaving such fields out keeps the
    windows small."""
    summary: bool = False
    """Its newest value is in a job's ``summary`` and in the command lines' progress."""
    chart: str | None = None
    """The :class:`~amptrain.contract.charts.Chart` that draws it (its ``key``); None: not
    drawn."""
    parallel: bool = False
    """Only data-parallel runs (devices > 1) carry it; null for one device."""
    optional: bool = False
    """Null by design in some runs (e.g. the loss scale outside fp16): progress lines leave
    it out instead of printing n/a."""
    source: Literal["device", "scaler", "host"] = "host"
    """Where the engine gets it: ``device``, a tensor of every step kept on the device and
    read once per flush (the engine's device buffer holds these, in this table's order);
    ``scaler``, the GradScaler's per-step device state, only with a scaler (fp16);
    ``host``, computed on the host at the flush (times, memory, counters)."""

    better: Literal["higher", "lower"] | None = None
    """Evaluation metrics: which way is an improvement (the accuracy verdict and the
    dashboard use it); None for step fields."""
    bounds: tuple[float, float] | None = None
    """The lowest and highest value it can take (a fraction: ``(0, 1)``); the dashboard's
    axes stay within them. None: unbounded (a loss, a perplexity)."""

    @property
    def is_float(self) -> bool:
        return self.type == "float"


STEP_METRICS: tuple[Metric, ...] = (
    Metric("step", "int", "Optimizer step, 1-based."),
    Metric(
        "time",
        "float",
        "Unix seconds when the step finished (host clock at flush, interpolated per step).",
        unit="s",
    ),
    Metric(
        "loss",
        "float",
        "Mean loss of the step's micro-batches (unscaled).",
        extremes=True,
        summary=True,
        chart="loss",
        source="device",
    ),
    Metric(
        "loss_scale",
        "float",
        "fp16: the GradScaler scale used for this step; null for bf16/fp32.",
        label="scale",
        extremes=True,
        summary=True,
        chart="loss_scale",
        optional=True,
        source="scaler",
    ),
    Metric(
        "skipped",
        "bool",
        (
            "True when the optimizer skipped the step: inf/NaN gradients, or a loss spike "
            "with health.spike.action skip (its warning event says which)."
        ),
        source="scaler",
    ),
    Metric(
        "grad_norm",
        "float",
        "Global gradient norm after unscaling, before clipping; null when skipped.",
        extremes=True,
        chart="grad_norm",
        source="device",
    ),
    Metric("lr", "float", "Learning rate used for this step.", chart="lr", source="device"),
    Metric(
        "memory_allocated",
        "bytes",
        "CUDA allocator bytes on GPU, process RSS on CPU.",
        unit="bytes",
        extremes=True,
        chart="memory",
    ),
    Metric(
        "memory_reserved",
        "bytes",
        "CUDA reserved bytes on GPU, resident set size on CPU.",
        unit="bytes",
        chart="memory",
    ),
    Metric(
        "memory_peak",
        "bytes",
        "CUDA max allocated on GPU, process peak RSS on CPU (the maximum over ranks).",
        unit="bytes",
        label="mem",
        summary=True,
        chart="memory",
    ),
    Metric(
        "samples_per_second",
        "float",
        "Training throughput of the step (every rank's samples).",
        unit="samples/s",
        extremes=True,
        summary=True,
        chart="throughput",
    ),
    Metric("step_time_ms", "float", "Wall time of the step.", unit="ms", extremes=True),
    Metric(
        "skipped_steps",
        "int",
        "Skipped steps in this attempt so far, this one included.",
        label="skipped",
        summary=True,
    ),
    Metric("world_size", "int", "Number of data-parallel processes.", parallel=True),
    Metric(
        "memory_peak_per_rank",
        "ints",
        "Each rank's memory_peak, in rank order.",
        unit="bytes",
        parallel=True,
    ),
)

Task = Literal["classification", "language_model"]

FRACTION = (0.0, 1.0)
"""The bounds of a metric that is a fraction of samples, tokens or an area under a curve."""

EVAL_METRICS: tuple[Metric, ...] = (
    Metric(
        "eval_loss",
        "float",
        "Mean loss over the evaluated held-out samples (the job's loss function).",
        label="eval loss",
        summary=True,
        better="lower",
    ),
    Metric(
        "accuracy",
        "float",
        "Classification: fraction of held-out samples whose top class is the label (0-1).",
        label="acc",
        summary=True,
        better="higher",
        bounds=FRACTION,
    ),
    Metric(
        "top5_accuracy",
        "float",
        "Classification with more than 5 classes: fraction whose label is in the top 5.",
        label="top5",
        better="higher",
        bounds=FRACTION,
    ),
    Metric(
        "perplexity",
        "float",
        "Language model: exp(eval_loss), the mean per-token perplexity.",
        label="ppl",
        summary=True,
        better="lower",
    ),
    Metric(
        "token_accuracy",
        "float",
        "Language model: fraction of held-out tokens predicted exactly (argmax).",
        label="tok acc",
        better="higher",
        bounds=FRACTION,
    ),
    Metric(
        "f1_macro",
        "float",
        "Classification: F1 score per class, averaged over the classes (macro; 0-1).",
        label="f1",
        better="higher",
        bounds=FRACTION,
    ),
    Metric(
        "precision_macro",
        "float",
        "Classification: precision per class, averaged over the classes (macro; 0-1).",
        label="prec",
        better="higher",
        bounds=FRACTION,
    ),
    Metric(
        "recall_macro",
        "float",
        "Classification: recall per class, averaged over the classes (macro; 0-1).",
        label="recall",
        better="higher",
        bounds=FRACTION,
    ),
    Metric(
        "auroc_macro",
        "float",
        "Classification: area under each class's one-vs-rest ROC curve of the softmax "
        "probabilities (exact), averaged over the classes (macro; 0-1).",
        label="auroc",
        better="higher",
        bounds=FRACTION,
    ),
)
"""The built-in evaluation metrics; which a job computes depends on its dataset's task
(:data:`EVAL_METRICS_BY_TASK`, :mod:`amptrain.contract.eval_choice`) and its ``eval.metrics``.
The ``_macro`` ones are computed by ``torchmetrics`` (not a mean of a per-sample value)
and synchronised across data-parallel ranks by it."""

EVAL_METRICS_BY_TASK: dict[Task, tuple[str, ...]] = {
    "classification": ("eval_loss", "accuracy", "top5_accuracy"),
    "language_model": ("eval_loss", "perplexity", "token_accuracy"),
}
"""Built-in metrics per task computed when ``eval.metrics`` is null (``top5_accuracy`` only
with more than 5 classes)."""

SERIES_NAME_MAX = 48
"""The longest name of a named series."""
SERIES_NAME = re.compile(rf"[a-z][a-z0-9_]{{0,{SERIES_NAME_MAX - 1}}}")
"""What a named series (an evaluation metric, built-in or a plugin's) may be called."""


def check_series_name(name: str) -> str:
    """``name`` if it can name a series, else ValueError saying why: lowercase letters,
    digits and ``_``, starting with a letter, at most :data:`SERIES_NAME_MAX` characters,
    and not a step field."""
    if not isinstance(name, str) or not SERIES_NAME.fullmatch(name):
        raise ValueError(
            f"metric name {name!r}: use lowercase letters, digits and _, starting with a "
            f"letter, at most {SERIES_NAME_MAX} characters"
        )
    if name in BY_NAME:
        raise ValueError(f"metric name {name!r} is a per-step field; choose another")
    return name


EVAL_KIND = "eval"
LAYER_NORM_KIND = "layer_grad_norm"
VALUE_KINDS = (EVAL_KIND, LAYER_NORM_KIND)
"""The kinds of named series (``metric_chunks.kind`` of their chunks), each also the
``kind`` of the record that carries them: ``eval``, one evaluation's metrics
(:func:`~amptrain.contract.records.evaluation`); ``layer_grad_norm``, one step's per-layer
gradient norms (:func:`~amptrain.contract.records.layer_norms`)."""
VALUE_KIND_MAX = 16
"""How long a kind may be (the width of its column)."""


BY_NAME: dict[str, Metric] = {m.name: m for m in STEP_METRICS}
METRIC_FIELDS: tuple[str, ...] = tuple(m.name for m in STEP_METRICS if not m.parallel)
"""Every metric record has exactly these keys, in this order."""
PARALLEL_METRIC_FIELDS: tuple[str, ...] = tuple(m.name for m in STEP_METRICS if m.parallel)
"""Present only in the records of a data-parallel run, after :data:`METRIC_FIELDS`. There
``loss`` is the mean over ranks and the memory fields are the maximum over ranks."""
STORED_METRIC_FIELDS: tuple[str, ...] = METRIC_FIELDS + PARALLEL_METRIC_FIELDS
"""Every field of a metric point as stored and returned (the parallel ones null for one
device)."""
EXTREMA_FIELDS: tuple[str, ...] = tuple(m.name for m in STEP_METRICS if m.extremes)
"""Fields whose per-bucket minimum and maximum a downsampled read keeps."""
SUMMARY_FIELDS: tuple[str, ...] = tuple(m.name for m in STEP_METRICS if m.summary)
"""The newest point's fields a job's ``summary`` shows."""
FLOAT_FIELDS: frozenset[str] = frozenset(m.name for m in STEP_METRICS if m.is_float)


def device_fields(with_scaler: bool) -> tuple[str, ...]:
    """The per-step device values the engine keeps for a flush, in the table's order."""
    return tuple(
        m.name
        for m in STEP_METRICS
        if m.source == "device" or (with_scaler and m.source == "scaler")
    )


_PY_TYPES: dict[MetricType, type] = {
    "int": int,
    "float": float,
    "bool": bool,
    "bytes": int,
    "ints": list,
}


def python_type(metric: Metric) -> type:
    """The Python type of a value (``None`` aside)."""
    return _PY_TYPES[metric.type]


EVAL_BY_NAME: dict[str, Metric] = {m.name: m for m in EVAL_METRICS}


def eval_metric(name: str) -> Metric:
    """The definition of an evaluation metric: a built-in one, or for a name a plugin
    added, a plain float labelled by its name (never rejected)."""
    return EVAL_BY_NAME.get(name) or Metric(name, "float", f"Evaluation metric {name}.")


def catalog() -> dict[str, Any]:
    """The table as ``GET /catalog`` serves it (the dashboard draws its charts from it)."""
    return {
        "metrics": [asdict(m) for m in STEP_METRICS],
        "charts": [asdict(c) for c in CHARTS],
        "eval_metrics": [asdict(m) for m in EVAL_METRICS],
    }


def show(name: str, value: Any) -> str:
    """A value as a progress line prints it: ``"loss 0.1234"``, ``"mem 512 MiB"``,
    ``"acc 0.93"`` (a step field or an evaluation metric)."""
    metric = BY_NAME.get(name) or eval_metric(name)
    label = metric.label or metric.name
    if value is None:
        return f"{label} n/a"
    if metric.unit == "bytes":
        return f"{label} {value / 2**20:.0f} MiB"
    if metric.unit == "samples/s":
        return f"{value:,.0f} samples/s"
    if metric.type == "float" and math.isfinite(value):
        exact = value.is_integer() and abs(value) < 2**53  # a loss scale of 65536, say
        return f"{label} {int(value)}" if exact else f"{label} {value:.4g}"
    return f"{label} {value}"
