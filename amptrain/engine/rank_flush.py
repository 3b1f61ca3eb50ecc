"""Devices > 1: what the ranks exchange at each telemetry flush.

One all-gather carries every rank's step values, memory and stop request, and one host
read brings them back: every rank then builds the same records (loss: the mean over
ranks; memory: the maximum, plus each rank's peak), the guardian judges the same values on
every rank, and all ranks stop (or roll back, or fall back) together.
"""

from __future__ import annotations

from typing import Any

import torch

from amptrain.engine.distributed import STOP_CODES, Group, stop_name
from amptrain.engine.host import HostReads
from amptrain.engine.layer_norms import vectors
from amptrain.engine.memory import MemorySnapshot, snapshot
from amptrain.engine.step_records import Pending


class RankFlush:
    """The flush's collective, and the stop request it carries."""

    def __init__(self, group: Group, device: torch.device) -> None:
        self._group = group
        self._device = device
        self._requested: str | None = None  # this rank's, carried by the next flush
        self._agreed: str | None = None  # every rank's at the last flush (cancel wins)

    def agree(self, reason: str | None) -> str | None:
        """The stop to act on now: ``reason`` itself in one process; with devices > 1 the one
        every rank agreed on at the last flush (``reason`` rides the next one; cancel wins)."""
        if not self._group.parallel:
            return reason
        if reason is not None and self._requested != "cancel":
            self._requested = reason
        return self._agreed

    def reduce(
        self,
        host: HostReads,
        step_values: list[torch.Tensor],
        pending: list[Pending],
        fields: tuple[str, ...],
    ) -> tuple[list[float], MemorySnapshot, dict[str, Any]]:
        """Every rank's ``step_values`` (``fields`` per step of ``pending``, device tensors)
        with its memory and stop request, in ONE all-gather and ONE host read.

        Returns the per-step values (the loss averaged over ranks; grad norm, lr, inf flag,
        scale and overflow attribution are equal on all ranks, the gradients having been
        all-reduced), the memory maximum over ranks, and the extra record fields."""
        mem = snapshot(self._device)
        tail = {**mem._asdict(), "stop": STOP_CODES[self._requested]}
        ends = torch.tensor(list(tail.values()), dtype=torch.float64, device=self._device)
        layers = [v.double() for v in vectors(pending)]  # equal on all ranks (all-reduced)
        row = torch.cat([torch.stack(step_values).double(), *layers, ends]) if step_values else ends
        rows = host.table(self._group.gather_rows(row))  # the collective, then the read
        values = rows[self._group.rank][: -len(tail)]
        tails = [dict(zip(tail, r[-len(tail) :], strict=True)) for r in rows]
        for i in range(fields.index("loss"), len(pending) * len(fields), len(fields)):
            values[i] = sum(r[i] for r in rows) / len(rows)
        self._agreed = stop_name(max(t["stop"] for t in tails))
        top = MemorySnapshot(*(int(max(t[f] for t in tails)) for f in MemorySnapshot._fields))
        extra = {"world_size": len(rows), "memory_peak_per_rank": [int(t["peak"]) for t in tails]}
        return values, top, extra
