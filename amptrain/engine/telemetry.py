"""Per-step records without per-step host syncs.

Each step hands over its values as device tensors (references only: no kernel,
no copy), the learning rate included. They reach the host together, through
:class:`~amptrain.engine.host.HostReads`, when a flush is due: every
``flush_every_steps`` steps or after ``flush_every_ms``, whichever comes first. That
is also when memory is read (one ``torch.cuda.memory_stats()`` call), health is checked
and the batch is offered to the :class:`~amptrain.engine.publisher.Publisher`.

On a single CUDA device a due flush does not wait for the device either: it queues ONE
copy of the window's values into pinned host memory (:meth:`HostReads.start`) and
publishes the windows whose copies have completed, normally the previous one. Their step
times come from the device itself (timed events between the ends of two windows). So a
record reaches the sink one flush later than it would with a wait, and divergence is
caught one flush later. The first flush, an explicit :meth:`StepTelemetry.flush`
(events, checkpoints, the end of a run) and a CPU run read at once, in one
``torch.stack(...).tolist()``, everything not yet published.

With devices > 1 a flush is due only by step count (clocks differ between ranks, and
every rank must reach the flush's one all-gather together). The all-gather carries each
rank's values, memory and stop request; every rank builds the same records from it
(loss: the mean over ranks; memory: the maximum, plus each rank's peak) and runs the same
health checks, so all ranks stop together; only rank 0's publisher has a sink.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from amptrain.contract.errors import TrainingError
from amptrain.contract.metrics import device_fields
from amptrain.contract.records import event
from amptrain.contract.spec import SpikeSpec, TelemetrySpec
from amptrain.engine.amp_step import Overflow
from amptrain.engine.attribution import Attribution
from amptrain.engine.distributed import STOP_CODES, Group, stop_name
from amptrain.engine.health import HealthMonitor
from amptrain.engine.host import HostReads, InFlight
from amptrain.engine.layer_norms import LayerValues, layer_records, vectors
from amptrain.engine.memory import MemorySnapshot, snapshot
from amptrain.engine.publisher import Publisher
from amptrain.engine.spikes import SPIKE_SLOTS, SpikeFlag
from amptrain.engine.step_records import (
    Pending,
    Spike,
    Totals,
    dropped_warning,
    step_records,
    timeline,
)


@dataclass
class _Window:
    """A flush's steps whose values are being copied to pinned host memory (CUDA)."""

    pending: list[Pending]
    copy: InFlight
    memory: MemorySnapshot


class StepTelemetry:
    """Collects step records on the device, flushes them to the host and the publisher."""

    def __init__(
        self,
        spec: TelemetrySpec,
        device: torch.device,
        health: HealthMonitor,
        publisher: Publisher,
        *,
        with_scaler: bool,
        group: Group | None = None,
        read_later: bool | None = None,
        spike: SpikeSpec | None = None,
    ) -> None:
        """``read_later``: due flushes queue copies and publish the completed ones instead of
        waiting for the device (None: on a single CUDA device). ``spike``: ``health.spike``."""
        self._spec = spec
        self._group = group or Group(None, device)
        self._device = device
        self._health = health
        self._publisher = publisher
        self.attribution = Attribution(with_scaler)
        self._metric_fields = device_fields(with_scaler)  # what a step hands over, in order
        self._spike = spike
        # A step's values as read: metrics, any spike slots, fp16's attribution code last.
        self._fields = self._metric_fields + (SPIKE_SLOTS if spike else ()) + self.attribution.slots
        self._spikes: dict[int, Spike] = {}  # read, not yet published
        self._values: list[torch.Tensor] = []  # per step, one per field of _metric_fields
        self._layer_out: list[dict[str, Any]] = []  # layer_grad_norm records, not yet published
        self._pending: list[Pending] = []
        self._windows: deque[_Window] = deque()  # copies queued, not yet read (CUDA)
        # Where the last window read ended on the device (the next one's start), and the host
        # time when the device had caught up (a read that waited): a checkpoint is not counted.
        self._mark: torch.cuda.Event | None = None
        self._mark_host: float | None = None
        if read_later is None:
            read_later = device.type == "cuda" and not self._group.parallel
        self._deferred = read_later
        self._wall_offset = time.time() - time.perf_counter()
        self._last_flush = time.perf_counter()
        self._flush_interval_s = spec.flush_every_ms / 1000.0
        self._dropped_reported = 0
        self.skipped_steps = 0
        self.last_record: dict[str, Any] | None = None
        self.host = HostReads()
        self.stop_requested: str | None = None
        """Devices > 1: this rank's stop request, carried to the other ranks by the next flush."""
        self.agreed_stop: str | None = None
        """Devices > 1: the stop every rank agreed on at the last flush (cancel wins)."""

    def record(
        self,
        step: int,
        values: Mapping[str, torch.Tensor],
        *,
        samples: int,
        started: float,
        overflow: Overflow | None = None,
        spike: SpikeFlag | None = None,
        layers: LayerValues | None = None,
    ) -> None:
        """Keep one step's device values (by metric name: ``loss``, ``grad_norm``, ``lr``,
        and with a scaler ``skipped``, its inf flag, ``loss_scale``, and ``overflow``, read
        with the rest at the flush, ``spike``, the step's spike check when it is on, ``layers``
        its per-layer norms when due); flush when one is due (may raise DivergedError)."""
        names = self.attribution.keep(overflow, values["loss"])
        self._values += (values[f] for f in self._metric_fields)
        if spike is not None:  # given exactly when the check is on
            self._values += spike.values()
        now = time.perf_counter()
        self._pending.append(Pending(step, samples, started, now, names, layers))
        # The first step of a run (or of a resumed run) flushes at once, so a watcher
        # sees the job training within a step of its start; later step-count flushes stay
        # on multiples of flush_every_steps, the boundaries every rank agrees on.
        every = self._spec.flush_every_steps
        if self.last_record is None:
            self.flush()
        elif (
            step % every == 0
            or len(self._pending) >= every
            or (not self._group.parallel and now - self._last_flush >= self._flush_interval_s)
        ):
            self._flush_due()

    def _flush_due(self) -> None:
        """A flush the steps made due: without a wait for the device where it can be."""
        if not self._deferred:
            self.flush()
            return
        self._windows.append(
            _Window(
                self._pending,
                self.host.start(self.attribution.interleave(self._values), vectors(self._pending)),
                snapshot(self._device),
            )
        )
        self._pending, self._values = [], []
        self._last_flush = time.perf_counter()
        self._publish(self._read_windows(wait=False))

    def event(self, type: str, step: int, **data: Any) -> None:
        """Send an event after the metrics of every step before it (forces a flush)."""
        self.flush([event(type, step, time.time(), **data)])

    def flush(self, extra: list[dict[str, Any]] | None = None) -> None:
        """Bring every value not yet published to the host, build records, check health,
        offer one batch.

        With devices > 1 this is a collective: every rank calls it at the same points."""
        if self._group.parallel:
            records = self._build_records(self._pending, *_reduce_ranks(self))
        else:
            records = self._read_windows(wait=True)
            if self._pending:
                read = self.attribution.interleave(self._values)
                values = self.host.floats(read, vectors(self._pending)) if read else []
                records += self._build_records(self._pending, values, snapshot(self._device), {})
                if self._deferred:
                    self._mark = self.host.mark()
            if self._deferred and self._mark is not None:
                # The device has just caught up: the next window starts here, and host time
                # before its first step (a checkpoint's) is idle time, not step time.
                self._mark_host = time.perf_counter()
        self._pending, self._values = [], []
        self._publish(records, extra)

    def _read_windows(self, wait: bool) -> list[dict[str, Any]]:
        """Records of the queued windows whose copies are done (all of them with ``wait``)."""
        records: list[dict[str, Any]] = []
        while self._windows and (wait or self._windows[0].copy.done.query()):
            window = self._windows.popleft()
            if wait:
                window.copy.done.synchronize()
            device_s = _device_seconds(self._mark, self._mark_host, window)
            self._mark, self._mark_host = window.copy.done, None
            records += self._build_records(
                window.pending, window.copy.floats(), window.memory, {}, device_s
            )
        return records

    def _publish(
        self, records: list[dict[str, Any]], extra: list[dict[str, Any]] | None = None
    ) -> None:
        """Check health, offer the records (and any drop warning, and ``extra``) as one batch."""
        skips = self.attribution.take([r["step"] for r in records])
        spikes = {r["step"]: s for r in records if (s := self._spikes.pop(r["step"], None))}
        warnings, error = self._health.check(records, skips, spikes)
        if error is not None and error.step is not None:
            # The run ends at the step it diverged: the steps after it in this flush trained
            # from a diverged state, and the job, its error, its events and its charts all
            # name one step (they said 33 beside 40/1000).
            records = [r for r in records if r["step"] <= error.step]
            skips = {k: v for k, v in skips.items() if k <= error.step}
        self.attribution.published(skips)
        layers, self._layer_out = [r for r in self._layer_out if _kept(r, error)], []
        batch = records + layers + warnings + (extra or [])
        dropped = self._publisher.dropped
        if dropped > self._dropped_reported:
            step = records[-1]["step"] if records else (self.last_record or {}).get("step", 0)
            batch.append(dropped_warning(step, dropped))
            self._dropped_reported = dropped
        self._publisher.offer(batch)
        stop = error or self._health.take_rollback()  # diverged first: nothing to roll back
        if stop is not None:
            raise stop

    def close(self, timeout: float) -> None:
        """Deliver what is queued (up to ``timeout`` s); report drops in a final warning."""
        step = lambda: (self.last_record or {}).get("step", 0)  # noqa: E731 (at the drop)
        self._publisher.close(timeout, notice=lambda n: [dropped_warning(step(), n)])

    def _build_records(
        self,
        pending: list[Pending],
        values: list[float],
        mem: MemorySnapshot,
        extra: dict[str, Any],
        device_s: float | None = None,
    ) -> list[dict[str, Any]]:
        """``device_s``: how long the device took for these steps, when it was timed."""
        if not pending:
            return []
        host_done = time.perf_counter()
        if device_s is not None:
            device_done = pending[0].started + max(device_s, 0.0)
        else:
            device_done = host_done if self._device.type == "cuda" else pending[-1].ended
        totals = Totals(self._wall_offset, self.skipped_steps, mem, extra, self._spike)
        records, skips, spikes = step_records(  # reads the step values, not the layer norms
            pending, self._fields, values, timeline(pending, device_done), totals
        )
        self._layer_out += layer_records(pending, values, len(self._fields), records)
        self.attribution.read(skips)
        self._spikes.update((s.step, s) for s in spikes)
        self.skipped_steps = records[-1]["skipped_steps"]
        self._last_flush = host_done
        self.last_record = records[-1]
        return records


def _kept(record: dict[str, Any], error: TrainingError | None) -> bool:
    """Whether a record is published beside ``error`` (none after the step it diverged)."""
    return error is None or error.step is None or record["step"] <= error.step


def _device_seconds(
    mark: torch.cuda.Event | None, mark_host: float | None, window: _Window
) -> float | None:
    """The device's time for ``window`` since ``mark`` (where the previous read ended), less
    the host's idle time before its first step (None: no mark yet)."""
    if mark is None:
        return None
    idle = 0.0 if mark_host is None else window.pending[0].started - mark_host
    return mark.elapsed_time(window.copy.done) / 1000.0 - max(idle, 0.0)


def _reduce_ranks(tel: StepTelemetry) -> tuple[list[float], MemorySnapshot, dict[str, Any]]:
    """Devices > 1: ``tel``'s flush values from every rank, in ONE all-gather and ONE host
    read; sets ``tel.agreed_stop`` to the stop every rank agreed on.

    Returns the per-step values (the loss averaged over ranks; grad norm, lr, inf flag,
    scale and overflow attribution are equal on all ranks, the gradients having been
    all-reduced), the memory maximum over ranks, and the extra record fields."""
    mem = snapshot(tel._device)
    step_values = tel.attribution.interleave(tel._values)
    tail = {**mem._asdict(), "stop": STOP_CODES[tel.stop_requested]}
    ends = torch.tensor(list(tail.values()), dtype=torch.float64, device=tel._device)
    layers = [v.double() for v in vectors(tel._pending)]  # equal on all ranks (all-reduced)
    row = torch.cat([torch.stack(step_values).double(), *layers, ends]) if step_values else ends
    rows = tel.host.table(tel._group.gather_rows(row))  # the collective, then the read
    values = rows[tel._group.rank][: -len(tail)]
    tails = [dict(zip(tail, r[-len(tail) :], strict=True)) for r in rows]
    for i in range(
        tel._fields.index("loss"), len(tel._pending) * len(tel._fields), len(tel._fields)
    ):
        values[i] = sum(r[i] for r in rows) / len(rows)
    tel.agreed_stop = stop_name(max(t["stop"] for t in tails))
    top = MemorySnapshot(*(int(max(t[f] for t in tails)) for f in MemorySnapshot._fields))
    extra = {"world_size": len(rows), "memory_peak_per_rank": [int(t["peak"]) for t in tails]}
    return values, top, extra
