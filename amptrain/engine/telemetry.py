"""Per-step records without per-step host syncs.

Each step hands over its values as device tensors (references only: no kernel,
no copy), the learning rate included. They reach the host together, through
:class:`~amptrain.engine.host.HostReads`, when a flush is due: every
``flush_every_steps`` steps or after ``flush_every_ms``, whichever comes first. That
is also when memory is read (one ``torch.cuda.memory_stats()`` call), the guardian judges
what was read (:attr:`StepTelemetry.judge`) and the batch is offered to the
:class:`~amptrain.engine.publisher.Publisher`. Telemetry never acts on the verdict: every
call that may flush returns it, and the Trainer acts at the next step boundary. It only
obeys one part of it: once a verdict ended the run at a step, no record of a later step is
published (the job, its error, its events and its charts all name one step).

On a single CUDA device a due flush does not wait for the device either: it queues ONE
copy of the window's values into pinned host memory (:meth:`HostReads.start`) and
publishes the windows whose copies have completed, normally the previous one. Their step
times come from the device itself (timed events between the ends of two windows). So a
record reaches the sink one flush later than it would with a wait, and divergence is
caught one flush later. The first flush, an explicit :meth:`StepTelemetry.flush`
(events, checkpoints, evaluations, the end of a run) and a CPU run read at once, in one
``torch.stack(...).tolist()``, everything not yet published. ``read_later`` on a CPU takes
the same path with copies that complete one flush late
(:class:`~amptrain.engine.host.LateHostReads`), so every guardian test runs the single-GPU
read order too.

With devices > 1 a flush is due only by step count (clocks differ between ranks, and
every rank must reach the flush's one all-gather together). The all-gather carries each
rank's values, memory and stop request; every rank builds the same records from it
(loss: the mean over ranks; memory: the maximum, plus each rank's peak) and runs the same
guardian checks, so all ranks get the same verdicts; only rank 0's publisher has a sink.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from amptrain.contract.metrics import device_fields
from amptrain.contract.records import event
from amptrain.contract.spec import SpikeSpec, TelemetrySpec
from amptrain.engine.amp_step import Overflow
from amptrain.engine.attribution import Attribution
from amptrain.engine.distributed import Group
from amptrain.engine.guardian import Continue, Reading, Verdict
from amptrain.engine.host import CopyDone, HostReads, InFlight, LateHostReads
from amptrain.engine.layer_norms import LayerValues, layer_records, vectors
from amptrain.engine.memory import MemorySnapshot, snapshot
from amptrain.engine.publisher import Publisher
from amptrain.engine.rank_flush import RankFlush
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
        publisher: Publisher,
        *,
        with_scaler: bool,
        group: Group | None = None,
        read_later: bool | None = None,
        spike: SpikeSpec | None = None,
    ) -> None:
        """``read_later``: due flushes queue copies and publish the done ones, not waiting (None:
        on one CUDA device; True on a CPU: done one flush late). ``spike``: ``health.spike``."""
        self._spec = spec
        self._group = group or Group(None, device)
        self._device = device
        self._publisher = publisher
        self.judge: Callable[[Reading], Verdict] = _carry_on  # the Trainer's: the guardian
        self.extras: Callable[[int], list[dict[str, Any]]] = lambda step: []
        """Records that go out with each flush (the data path's events), given its step."""
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
        self._mark: CopyDone | None = None
        self._mark_host: float | None = None
        # Devices > 1 always read at once: a flush is the ranks' collective, every rank at once.
        read_later = device.type == "cuda" if read_later is None else read_later
        self._deferred = read_later and not self._group.parallel
        self._wall_offset = time.time() - time.perf_counter()
        self._last_flush = time.perf_counter()
        self._flush_interval_s = spec.flush_every_ms / 1000.0
        self._dropped_reported = 0
        self.skipped_steps = 0
        self.last_record: dict[str, Any] | None = None
        self.host = LateHostReads() if self._deferred and device.type != "cuda" else HostReads()
        self.ranks = RankFlush(self._group, device)

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
    ) -> Verdict:
        """Keep one step's device values (``loss``, ``grad_norm``, ``lr``; with a scaler its
        inf flag ``skipped`` and ``loss_scale``; ``overflow``, ``spike`` and ``layers`` when
        on) and flush when due; the verdict on what the flush read (else Continue)."""
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
            return self.flush()
        if (
            step % every == 0
            or len(self._pending) >= every
            or (not self._group.parallel and now - self._last_flush >= self._flush_interval_s)
        ):
            return self._flush_due()
        return Continue()

    def _flush_due(self) -> Verdict:
        """A flush the steps made due: without a wait for the device where it can be."""
        if not self._deferred:
            return self.flush()
        self._windows.append(
            _Window(
                self._pending,
                self.host.start(self.attribution.interleave(self._values), vectors(self._pending)),
                snapshot(self._device),
            )
        )
        self._pending, self._values = [], []
        self._last_flush = time.perf_counter()
        return self._publish(self._read_windows(wait=False))

    def event(self, type: str, step: int, **data: Any) -> Verdict:
        """Send an event after the metrics of every step before it (forces a flush)."""
        return self.flush([event(type, step, time.time(), **data)])

    def flush(self, extra: list[dict[str, Any]] | None = None) -> Verdict:
        """Bring every value not yet published to the host, build records, have the guardian
        judge them, offer one batch; the verdict. Devices > 1: a collective (every rank)."""
        if self._group.parallel:
            read = self.attribution.interleave(self._values)
            reduced = self.ranks.reduce(self.host, read, self._pending, self._fields)
            records = self._build_records(self._pending, *reduced)
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
        return self._publish(records, extra)

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
    ) -> Verdict:
        """Have the guardian judge the records, offer them (with its warnings, any drop
        warning and ``extra``) as one batch; the verdict."""
        skips = self.attribution.take([r["step"] for r in records])
        spikes = {r["step"]: s for r in records if (s := self._spikes.pop(r["step"], None))}
        verdict = self.judge(Reading(records, skips, spikes))
        end = verdict.ends_at
        if end is not None:
            # The run ends at that step: the steps after it trained from a diverged state (or
            # were read after the end, one window late on a GPU), and the job, its error, its
            # events and its charts all name one step (they said 33 beside 40/1000).
            records = [r for r in records if r["step"] <= end]
            skips = {k: v for k, v in skips.items() if k <= end}
        self.attribution.published(skips)
        layers = [r for r in self._layer_out if end is None or r["step"] <= end]
        self._layer_out = []
        step = records[-1]["step"] if records else (self.last_record or {}).get("step", 0)
        batch = records + layers + list(verdict.warnings) + (extra or []) + self.extras(step)
        dropped = self._publisher.dropped
        if dropped > self._dropped_reported:
            batch.append(dropped_warning(step, dropped))
            self._dropped_reported = dropped
        self._publisher.offer(batch)
        return verdict

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


def _carry_on(reading: Reading) -> Verdict:
    return Continue()


def _device_seconds(
    mark: CopyDone | None, mark_host: float | None, window: _Window
) -> float | None:
    """The device's time for ``window`` since ``mark`` (where the previous read ended), less
    the host's idle time before its first step (None: no mark yet)."""
    if mark is None:
        return None
    idle = 0.0 if mark_host is None else window.pending[0].started - mark_host
    return mark.elapsed_time(window.copy.done) / 1000.0 - max(idle, 0.0)
