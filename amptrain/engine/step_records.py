"""A telemetry window's steps as records: their times on the device's clock and the values
read back from it.

:class:`~amptrain.engine.telemetry.StepTelemetry` decides when a window is read; this
module turns what was read into the ``metric`` records of :mod:`amptrain.contract.records`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amptrain.contract.records import event, metric
from amptrain.contract.spec import SpikeSpec
from amptrain.engine.memory import MemorySnapshot

if TYPE_CHECKING:
    from amptrain.engine.layer_norms import LayerValues

ATTRIBUTION_SLOTS: tuple[str, ...] = ("overflow",)
"""With a scaler, each step's device values end with this (not a metric field): its
first non-finite parameter in the recorded backward order as ``2 * priority + isnan`` (-1:
none; see :func:`~amptrain.engine.attribution.first_nonfinite`), read with the rest at the
flush and turned into a :class:`Skip` for a skipped step only."""


@dataclass
class Pending:
    """Host-side facts of one step; its device values sit in ``StepTelemetry._values``."""

    step: int
    samples: int
    started: float  # perf_counter when the step was entered
    ended: float  # perf_counter when its last kernel was *enqueued*
    names: tuple[str, ...] = ()
    """The parameters the ``overflow`` code indexes (fp16), by priority in backward order
    (:attr:`~amptrain.engine.amp_step.Overflow.ranked`); shared, not copied, per step."""
    layers: LayerValues | None = None
    """A step due for per-layer norms: its layers (their values are read after the
    window's step values)."""


@dataclass(frozen=True)
class Skip:
    """A skipped step's overflow attribution, as read at the flush."""

    step: int
    param: str | None
    """The first parameter in backward order whose gradient norm was inf/NaN; None when
    every norm was finite (the scaler saw the non-finite value elsewhere)."""
    norm: str | None
    """``"inf"`` or ``"nan"``: that parameter's gradient norm."""


@dataclass(frozen=True)
class Spike:
    """A step the spike check flagged, as read at the flush."""

    step: int
    value: float
    """The checked value (the loss or the gradient norm)."""
    mean: float
    std: float
    """The window's mean and standard deviation it was compared with."""


@dataclass
class Totals:
    """What every record of a window shares: the clock offset, the run's skipped steps so
    far, the window's memory, and the fields a multi-device flush adds."""

    wall_offset: float  # time.time() - time.perf_counter()
    skipped_before: int
    memory: MemorySnapshot
    extra: dict[str, Any]
    spike: SpikeSpec | None = None
    """``health.spike`` when the check is on: each step's values then hold the
    :data:`~amptrain.engine.spikes.SPIKE_SLOTS`, and with an action that withholds the update
    a spike's step is recorded as skipped."""


def timeline(pending: list[Pending], device_done: float) -> list[tuple[float, float]]:
    """Per-step (start, end) times, stretched so the window ends when the device finished.

    On CUDA the host only measures when kernels were enqueued; the device's own
    timing of the window (or, at a flush that waits, the moment the wait ends) tells
    when it actually finished, so the window is scaled to end there. On the CPU the
    two nearly coincide.
    """
    origin, last = pending[0].started, pending[-1].ended
    stretch = (device_done - origin) / (last - origin) if last > origin else 1.0
    stretch = max(stretch, 1.0)

    def at(t: float) -> float:
        return origin + (t - origin) * stretch

    return [(at(p.started), at(p.ended)) for p in pending]


def step_records(
    pending: list[Pending],
    fields: tuple[str, ...],
    values: list[float],
    times: list[tuple[float, float]],
    totals: Totals,
) -> tuple[list[dict[str, Any]], list[Skip], list[Spike]]:
    """One record per step: ``values`` holds each step's ``fields`` in order (metric fields,
    then any spike slots, then any :data:`ATTRIBUTION_SLOTS`), ``times`` its (start, end).
    Also the attribution of each skipped step, and the spikes."""
    width = len(fields)
    skipped_steps = totals.skipped_before
    mem = totals.memory
    records = []
    skips = []
    spikes = []
    for i, (p, (start, end)) in enumerate(zip(pending, times, strict=True)):
        device: dict[str, Any] = dict(zip(fields, values[i * width : (i + 1) * width], strict=True))
        code = device.pop(ATTRIBUTION_SLOTS[0], None)
        skipped = device.pop("skipped", 0.0) > 0  # the scaler's inf flag
        if skipped:
            device["grad_norm"] = None  # not a norm: the gradients held inf/NaN
            skips.append(_skip(p, code))
        spike = _spike(p, device, totals.spike.metric if totals.spike else None)
        if spike is not None:
            spikes.append(spike)
            # With skip or rollback, its update was withheld too.
            skipped = skipped or (totals.spike is not None and totals.spike.withholds)
        skipped_steps += skipped
        step_s = max(end - start, 1e-9)
        records.append(
            metric(
                step=p.step,
                time=totals.wall_offset + end,
                skipped=skipped,
                **device,
                memory_allocated=mem.allocated,
                memory_reserved=mem.reserved,
                memory_peak=mem.peak,
                samples_per_second=p.samples / step_s,
                step_time_ms=step_s * 1000.0,
                skipped_steps=skipped_steps,
                **totals.extra,
            )
        )
    return records, skips, spikes


def _spike(p: Pending, device: dict[str, Any], metric: str | None) -> Spike | None:
    """Pops the spike slots from a step's values; the spike they flag, if any."""
    if metric is None:
        return None
    flag, mean, std = device.pop("spike"), device.pop("spike_mean"), device.pop("spike_std")
    if not flag > 0:
        return None
    return Spike(p.step, device[metric], mean, std)


def _skip(p: Pending, code: float | None) -> Skip:
    if code is None or not math.isfinite(code) or code < 0:
        return Skip(p.step, None, None)
    priority, nan = divmod(int(code), 2)
    if priority >= len(p.names):
        return Skip(p.step, None, None)
    return Skip(p.step, p.names[priority], "nan" if nan else "inf")


def dropped_warning(step: int, dropped: int) -> dict[str, Any]:
    """The warning a run's records carry once its publisher had to drop some."""
    return event(
        "warning",
        step,
        time.time(),
        code="telemetry_dropped",
        message=f"{dropped} telemetry records dropped: the sink was slower than training",
    )
