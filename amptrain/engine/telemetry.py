"""Per-step records without per-step host syncs.

Each step hands over its values as device tensors (references only: no kernel,
no copy), the learning rate included. They reach the host together, in ONE
``torch.stack(...).tolist()`` through :class:`~amptrain.engine.host.HostReads`,
when a flush is due: every ``flush_every_steps`` steps or after
``flush_every_ms``, whichever comes first. That is also when memory is read
(one ``torch.cuda.memory_stats()`` call), health is checked and the batch is
offered to the :class:`~amptrain.engine.publisher.Publisher`.

With devices > 1 a flush is due only by step count (clocks differ between ranks, and
every rank must reach the flush's one all-gather together). The all-gather carries each
rank's values, memory and stop request; every rank builds the same records from it
(loss: the mean over ranks; memory: the maximum, plus each rank's peak) and runs the same
health checks, so all ranks stop together; only rank 0's publisher has a sink.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from amptrain.contract.records import event, metric
from amptrain.contract.spec import TelemetrySpec
from amptrain.engine.distributed import STOP_CODES, Group, stop_name
from amptrain.engine.health import HealthMonitor
from amptrain.engine.host import HostReads
from amptrain.engine.memory import MemorySnapshot, snapshot
from amptrain.engine.publisher import Publisher


@dataclass
class _Pending:
    """Host-side facts of one step; its device values sit in ``StepTelemetry._values``."""

    step: int
    samples: int
    started: float  # perf_counter when the step was entered
    ended: float  # perf_counter when its last kernel was *enqueued*


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
    ) -> None:
        self._spec = spec
        self._group = group or Group(None, device)
        self._device = device
        self._health = health
        self._publisher = publisher
        self._with_scaler = with_scaler
        self._values: list[torch.Tensor] = []  # per step: loss, grad_norm, lr[, found_inf, scale]
        self._pending: list[_Pending] = []
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
        *,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        found_inf: torch.Tensor | None,
        scale: torch.Tensor | None,
        lr: torch.Tensor,
        samples: int,
        started: float,
    ) -> None:
        """Keep one step's values; flush when a flush is due (may raise DivergedError)."""
        self._values += (loss, grad_norm, lr)
        if self._with_scaler:
            assert found_inf is not None and scale is not None
            self._values += (found_inf, scale)
        now = time.perf_counter()
        self._pending.append(_Pending(step, samples, started, now))
        # The first step of a run (or of a resumed run) flushes at once, so a watcher
        # sees the job training within a step of its start; later step-count flushes stay
        # on multiples of flush_every_steps, the boundaries every rank agrees on.
        every = self._spec.flush_every_steps
        if (
            self.last_record is None
            or step % every == 0
            or len(self._pending) >= every
            or (not self._group.parallel and now - self._last_flush >= self._flush_interval_s)
        ):
            self.flush()

    def event(self, type: str, step: int, **data: Any) -> None:
        """Send an event after the metrics of every step before it (forces a flush)."""
        self.flush([event(type, step, time.time(), **data)])

    def flush(self, extra: list[dict[str, Any]] | None = None) -> None:
        """Bring pending values to the host, build records, check health, offer one batch.

        With devices > 1 this is a collective: every rank calls it at the same points."""
        if self._group.parallel:
            records = self._build_records(*self._reduce())
        elif self._pending:
            values = self.host.floats(self._values) if self._values else []
            records = self._build_records(values, snapshot(self._device), {})
        else:
            records = []
        warnings, error = self._health.check(records)
        batch = records + warnings + (extra or [])
        dropped = self._publisher.dropped
        if dropped > self._dropped_reported:
            step = records[-1]["step"] if records else (self.last_record or {}).get("step", 0)
            batch.append(self._dropped_warning(step, dropped))
            self._dropped_reported = dropped
        self._publisher.offer(batch)
        if error is not None:
            raise error

    def close(self, timeout: float) -> None:
        """Deliver what is queued (up to ``timeout`` s); report drops in a final warning."""
        self._publisher.close(timeout, notice=self._drop_notice)

    def _drop_notice(self, dropped: int) -> list[dict[str, Any]]:
        step = (self.last_record or {}).get("step", 0)
        return [self._dropped_warning(step, dropped)]

    @staticmethod
    def _dropped_warning(step: int, dropped: int) -> dict[str, Any]:
        return event(
            "warning",
            step,
            time.time(),
            code="telemetry_dropped",
            message=f"{dropped} telemetry records dropped: the sink was slower than training",
        )

    def _reduce(self) -> tuple[list[float], MemorySnapshot, dict[str, Any]]:
        """Devices > 1: this flush's values from every rank, in ONE all-gather and ONE host read.

        Returns the per-step values (the loss averaged over ranks; grad norm, lr, inf flag
        and scale are equal on all ranks, the gradients having been all-reduced), the
        memory maximum over ranks, and the extra record fields."""
        mem = snapshot(self._device)
        stop = STOP_CODES[self.stop_requested]
        tail = torch.tensor([*mem, stop], dtype=torch.float64, device=self._device)
        row = torch.cat([torch.stack(self._values).double(), tail]) if self._values else tail
        rows = self.host.table(self._group.gather_rows(row))  # the collective, then the read
        width = 5 if self._with_scaler else 3
        values = rows[self._group.rank][:-4]
        for i in range(0, len(values), width):
            values[i] = sum(r[i] for r in rows) / len(rows)
        self.agreed_stop = stop_name(max(r[-1] for r in rows))
        top = MemorySnapshot(*(int(max(r[k] for r in rows)) for k in (-4, -3, -2)))
        extra = {"world_size": len(rows), "memory_peak_per_rank": [int(r[-2]) for r in rows]}
        return values, top, extra

    def _build_records(
        self, values: list[float], mem: MemorySnapshot, extra: dict[str, Any]
    ) -> list[dict[str, Any]]:
        if not self._pending:
            return []
        host_done = time.perf_counter()
        width = 5 if self._with_scaler else 3
        pending, self._pending, self._values = self._pending, [], []
        records = []
        device_done = host_done if self._device.type == "cuda" else pending[-1].ended
        timeline = self._timeline(pending, device_done)
        for i, (p, (start, end)) in enumerate(zip(pending, timeline, strict=True)):
            loss, norm, lr, *rest = values[i * width : (i + 1) * width]
            skipped = bool(rest and rest[0] > 0)
            self.skipped_steps += skipped
            step_s = max(end - start, 1e-9)
            records.append(
                metric(
                    step=p.step,
                    time=self._wall_offset + end,
                    loss=loss,
                    loss_scale=rest[1] if rest else None,
                    skipped=skipped,
                    grad_norm=None if skipped else norm,
                    lr=lr,
                    memory_allocated=mem.allocated,
                    memory_reserved=mem.reserved,
                    memory_peak=mem.peak,
                    samples_per_second=p.samples / step_s,
                    step_time_ms=step_s * 1000.0,
                    skipped_steps=self.skipped_steps,
                    **extra,
                )
            )
        self._last_flush = host_done
        self.last_record = records[-1]
        return records

    @staticmethod
    def _timeline(pending: list[_Pending], device_done: float) -> list[tuple[float, float]]:
        """Per-step (start, end) times, stretched so the window ends when the device finished.

        On CUDA the host only measures when kernels were enqueued; the flush's
        sync tells when the device actually finished, so the window is scaled
        to end there. On the CPU the two nearly coincide.
        """
        origin, last = pending[0].started, pending[-1].ended
        stretch = (device_done - origin) / (last - origin) if last > origin else 1.0
        stretch = max(stretch, 1.0)

        def at(t: float) -> float:
            return origin + (t - origin) * stretch

        return [(at(p.started), at(p.ended)) for p in pending]
