"""The telemetry contract shared by the engine, the worker, the API and clients.

Torch-free. A *metric* record is one optimizer step; an *eval* record is one evaluation
on the held-out split (named values, see :data:`~amptrain.contract.metrics.EVAL_METRICS`);
a *layer_grad_norm* record is one step's per-layer gradient norms (named by module path);
an *event* is a lifecycle or health notice. All are plain dicts so that every hop (queue,
Redis stream, SQL row, JSON response) carries the same names.
"""

from __future__ import annotations

from typing import Any, Protocol

from amptrain.contract.eval_choice import CONFUSION_MATRIX
from amptrain.contract.layers import check_layer_path
from amptrain.contract.metrics import (
    EVAL_KIND,
    LAYER_NORM_KIND,
    METRIC_FIELDS,
    PARALLEL_METRIC_FIELDS,
    check_series_name,
)

PRECISION_FALLBACK = "precision_fallback"
"""The event of an attempt that fp16 left (``health.fallback``). Its data: ``trigger``
(``loss_scale_floor``, ``consecutive_skips`` or ``nonfinite_loss``), ``trigger_step``,
``from`` and ``to`` (precisions), ``resume_from`` (the step of the healthy checkpoint the
next attempt resumes from, 0: the start), ``checkpoint`` (its name, null: none), ``param``
(the first non-finite gradient's parameter of the last skipped step, when known) and
``message``."""

WAITING_FOR_NODES = "waiting_for_nodes"
"""A multi-node attempt could not reserve all its nodes in time and went back to the queue
(nothing charged): ``{"message", "nodes", "available", "queue", "retry_after_s"}``."""
ROLLBACK_EVENT = "rollback"
"""The event of a ``health.spike`` rollback (``action: rollback``), at the step the run went
on from. Its data: ``spike_step``; ``name``, the checkpoint gone back to, and ``from_step``,
its step (both null when there was none at or before the spike: the spike was only
skipped); ``samples_from`` and ``samples_to``, the samples skipped (half-open); ``rollbacks``,
the job's count so far; ``message``."""

WEIGHTS_EVENT = "weights"
"""A fresh start loaded ``weights.path``: ``loaded`` (tensors), ``cast_from`` (the file's
float dtypes other than the model's), and with ``strict: false`` what was left out:
``missing`` (kept their initialisation), ``unexpected`` (in the file only), ``shape``
(``{name: [file shape, model shape]}``); each list shortened, with its full count."""

FORK_EVENT = "forked"
"""A fork's first attempt started from its parent's checkpoint (see
:mod:`amptrain.contract.forks`), at that step: ``from_job``, ``from_step``, and
``optimizer``: ``kept`` (the parent's optimizer state with the fork's hyper-parameters) or
``fresh`` (another kind of optimizer). The fork's own checkpoint of that step follows it."""

DATA_EVENT = "data"
"""Once, at the start of an attempt: how its training data is fed. ``loader`` (``processes``,
``threads`` or ``device``), ``loader_workers`` (processes; 0 for threads or the device), and
when the dataset names its classes (an image folder's class folders, in label order)
``class_count`` and ``class_names`` (the first :data:`MAX_CLASS_NAMES_SHOWN`, each cut to
:data:`MAX_CLASS_NAME_CHARS` characters: 64 KB at most)."""

DATA_SKIPPED_EVENT = "data_skipped"
"""Samples the dataset skipped as corrupt (``on_corrupt: skip``), published with the telemetry
flush after they were seen: ``count``, the files skipped so far in this attempt (a file seen
again after a restart of the loader counts again); ``newest``, the newest few relative paths
(at most :data:`SKIPPED_PATHS_SHOWN`, each cut to :data:`MAX_NAME_CHARS` characters) as the
user wrote them, never a data root's absolute path. With ``devices`` > 1, rank 0's share."""

MAX_CLASS_NAMES_SHOWN = 1000
SKIPPED_PATHS_SHOWN = 5
MAX_CLASS_NAME_CHARS = 64
MAX_NAME_CHARS = 200

# Event types the engine emits itself; the worker adds lifecycle events
# (queued, started, resumed, succeeded, failed, cancelled) with the same shape.
ENGINE_EVENTS: tuple[str, ...] = (
    "checkpoint",
    "warning",
    "precision",
    "micro_batch",
    PRECISION_FALLBACK,
    ROLLBACK_EVENT,
    WEIGHTS_EVENT,
    FORK_EVENT,
    CONFUSION_MATRIX,  # eval.metrics asked for it: after each eval record (see eval_choice)
    DATA_EVENT,
    DATA_SKIPPED_EVENT,
)

SPIKE_WARNING = "loss_spike"
"""The ``code`` of the ``warning`` event of the steps the spike check flagged
(``health.spike``; for ``metric: grad_norm`` too): one per telemetry flush, at the first
spike it read. Its data: ``count``, ``first_step`` and ``last_step`` of the spikes it stands
for; the first one's ``value`` and the window's ``mean`` and ``std`` then; ``metric``, ``z``
and ``action``."""

OVERFLOW_WARNING = "gradient_overflow"
"""The ``code`` of the ``warning`` event of each skipped fp16 step. Its data names
``param``, the first parameter (module path, ``blocks.3.attn.proj.weight``) whose gradient
was non-finite in backward order (null when none was), and ``norm``, ``"inf"`` or
``"nan"``. A job's per-parameter overflow counts (``summary.overflow_counts``) count
these events, one per step."""


def metric(**values: Any) -> dict[str, Any]:
    """A metric record with every field of the metric table present (missing ones null)
    and nothing else; the :data:`~amptrain.contract.metrics.PARALLEL_METRIC_FIELDS` only
    when given."""
    unknown = set(values) - set(METRIC_FIELDS) - set(PARALLEL_METRIC_FIELDS)
    if unknown:
        raise KeyError(f"unknown metric fields: {sorted(unknown)}")
    record = {"kind": "metric", **{f: values.get(f) for f in METRIC_FIELDS}}
    record.update({f: values[f] for f in PARALLEL_METRIC_FIELDS if f in values})
    return record


def evaluation(step: int, time: float, values: dict[str, float | None]) -> dict[str, Any]:
    """An eval record: the held-out metrics of the model as it is after optimizer step
    ``step`` (``values``: metric name -> value; null when not finite), measured at unix
    ``time``. Names follow :func:`~amptrain.contract.metrics.check_series_name`."""
    for name in values:
        check_series_name(name)
    return {"kind": EVAL_KIND, "step": step, "time": time, "values": dict(values)}


def layer_norms(step: int, time: float, values: dict[str, float | None]) -> dict[str, Any]:
    """A ``layer_grad_norm`` record: each layer's gradient norm (after unscaling, before
    clipping; null when not finite) at optimizer step ``step``, finished at unix ``time``
    (``telemetry.layer_grad_norms_every``). Layer names follow
    :func:`~amptrain.contract.metrics.check_layer_path`."""
    for name in values:
        check_layer_path(name)
    return {"kind": LAYER_NORM_KIND, "step": step, "time": time, "values": dict(values)}


def event(type: str, step: int, time: float, **data: Any) -> dict[str, Any]:
    """An event record: ``type``, the step it happened at, unix time and free-form details."""
    return {"kind": "event", "type": type, "step": step, "time": time, "data": data}


class Sink(Protocol):
    """Where telemetry goes. Called from a background thread, never the training thread.

    ``write`` receives a batch of records (metrics, evals and events, in order). It may
    block or raise; the engine's publisher counts what it could not deliver.
    """

    def write(self, items: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...
