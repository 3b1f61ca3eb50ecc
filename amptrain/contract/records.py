"""The telemetry contract shared by the engine, the worker, the API and clients.

Torch-free. A *record* is one optimizer step; an *event* is a lifecycle or
health notice. Both are plain dicts so that every hop (queue, Redis stream,
SQL row, JSON response) carries the same names.
"""

from __future__ import annotations

from typing import Any, Protocol

# Every metric record has exactly these keys, in this order.
METRIC_FIELDS: tuple[str, ...] = (
    "step",  # optimizer step, 1-based
    "time",  # unix seconds when the step finished (host clock at flush, interpolated per step)
    "loss",  # mean loss of the step's micro-batches (unscaled)
    "loss_scale",  # fp16: the scale used for this step; null for bf16/fp32
    "skipped",  # true when inf/NaN gradients made the optimizer skip the step
    "grad_norm",  # global grad norm after unscaling, before clipping; null when skipped
    "lr",  # learning rate used for this step
    "memory_allocated",  # bytes; CUDA allocator on GPU, process RSS on CPU
    "memory_reserved",  # bytes; CUDA reserved on GPU, process VMS-free RSS on CPU
    "memory_peak",  # bytes; CUDA max allocated on GPU, process peak RSS on CPU
    "samples_per_second",
    "step_time_ms",
    "skipped_steps",  # cumulative skipped steps in this attempt, including this one
)

# Present only in the records of a data-parallel run (devices > 1), after METRIC_FIELDS.
# There ``loss`` is the mean over ranks and the memory fields are the maximum over ranks.
PARALLEL_METRIC_FIELDS: tuple[str, ...] = (
    "world_size",  # number of data-parallel processes
    "memory_peak_per_rank",  # list of each rank's memory_peak, in rank order
)

# Every field of a metric point as stored and returned (GET /jobs/{id}/metrics, the live
# stream): the PARALLEL_METRIC_FIELDS are null there for a one-device run.
STORED_METRIC_FIELDS: tuple[str, ...] = METRIC_FIELDS + PARALLEL_METRIC_FIELDS

# Event types the engine emits itself; the worker adds lifecycle events
# (queued, started, resumed, succeeded, failed, cancelled) with the same shape.
ENGINE_EVENTS: tuple[str, ...] = ("checkpoint", "warning", "precision", "micro_batch")


def metric(**values: Any) -> dict[str, Any]:
    """A metric record with every field present (missing ones null) and nothing else;
    the :data:`PARALLEL_METRIC_FIELDS` only when given."""
    unknown = set(values) - set(METRIC_FIELDS) - set(PARALLEL_METRIC_FIELDS)
    if unknown:
        raise KeyError(f"unknown metric fields: {sorted(unknown)}")
    record = {"kind": "metric", **{f: values.get(f) for f in METRIC_FIELDS}}
    record.update({f: values[f] for f in PARALLEL_METRIC_FIELDS if f in values})
    return record


def event(type: str, step: int, time: float, **data: Any) -> dict[str, Any]:
    """An event record: ``type``, the step it happened at, unix time and free-form details."""
    return {"kind": "event", "type": type, "step": step, "time": time, "data": data}


class Sink(Protocol):
    """Where telemetry goes. Called from a background thread, never the training thread.

    ``write`` receives a batch of records (metrics and events, in order). It may
    block or raise; the engine's publisher counts what it could not deliver.
    """

    def write(self, items: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...
