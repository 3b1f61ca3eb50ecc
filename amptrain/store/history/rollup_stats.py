"""A roll-up's aggregates (:class:`Stats`, the columns of ``metric_rollups`` after its key:
:data:`STATS`) and how two are combined (:meth:`Stats.merge`): the one layout the recorder's
upkeep (:mod:`amptrain.store.history.rollups`), the rebuild and the reads share."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import Any

STATS = (
    "first_step",
    "last_step",
    "count",
    "non_finite",
    "skipped",
    "flagged",
    "first_flag",
    "low",
    "low_step",
    "high",
    "high_step",
)
"""A roll-up's columns after its key, in order (the attributes of :class:`Stats`)."""


_ROW = attrgetter(*STATS)
_NONE = (0, 0, 0, 0, 0, 0, None, None, None, None, None)
"""The columns of :data:`STATS` of no steps."""


class Stats:
    """The aggregates of some steps of one series (the columns of :data:`STATS`)."""

    __slots__ = STATS
    first_step: int
    """The first and last step held (0 while ``count`` is 0)."""
    last_step: int
    count: int
    non_finite: int
    skipped: int
    flagged: int
    first_flag: int | None
    low: float | None
    """The lowest finite value and the first step holding it."""
    low_step: int | None
    high: float | None
    """The highest finite value and the first step holding it."""
    high_step: int | None

    def __init__(self, row: Iterable[Any] | None = None) -> None:
        # one unpacking, not a setattr per column: a read of a long run builds thousands
        (
            self.first_step,
            self.last_step,
            self.count,
            self.non_finite,
            self.skipped,
            self.flagged,
            self.first_flag,
            self.low,
            self.low_step,
            self.high,
            self.high_step,
        ) = _NONE if row is None else row

    def row(self) -> tuple[Any, ...]:
        """The values of :data:`STATS`, in order."""
        got: tuple[Any, ...] = _ROW(self)
        return got

    def merge(self, o: Stats) -> None:
        """Fold in the aggregates of other steps (ties: the earlier step holds the extreme)."""
        if not o.count:
            return
        if not self.count or o.first_step < self.first_step:
            self.first_step = o.first_step
        if not self.count or o.last_step > self.last_step:
            self.last_step = o.last_step
        self.count += o.count
        self.non_finite += o.non_finite
        self.skipped += o.skipped
        self.flagged += o.flagged
        if o.first_flag is not None and (self.first_flag is None or o.first_flag < self.first_flag):
            self.first_flag = o.first_flag
        if o.low is not None and (
            self.low is None or (o.low, o.low_step) < (self.low, self.low_step)
        ):
            self.low, self.low_step = o.low, o.low_step
        if o.high is not None and (
            self.high is None or (-o.high, o.high_step) < (-self.high, self.high_step)
        ):
            self.high, self.high_step = o.high, o.high_step
