"""The roll-up aggregates of several series over the same ascending steps at once: one
numpy pass over a (series x steps) block instead of a few passes of builtins per series.

The recorder's common batch appends a point's ~12 step series to one chunk over the same
steps, so the roll-ups' upkeep (:func:`amptrain.store.history.rollups.keep`) takes such a
group as a block (:func:`part_blocks`, :func:`gained_blocks`), and the chunk rows take
each gained part's lowest and highest value and non-finite count from it; anything else keeps the per-series route
(:func:`~amptrain.store.history.rollups.gained_stats`), which follows the same rules: the
lowest and highest finite value and the first step holding each (ties: the earliest
step), a null, NaN or infinity counted as not finite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice
from operator import lt
from typing import TYPE_CHECKING, Any

from amptrain.store.history.chunk_merge import Gained, floats
from amptrain.store.history.chunk_parts import STEP_KIND, Key, Part

if TYPE_CHECKING:
    import numpy

Row = tuple[Any, ...]
"""The columns of :data:`~amptrain.store.history.rollup_stats.STATS`, in order."""


def block_stats(steps: list[int], values: numpy.ndarray) -> list[Row]:
    """Per row of ``values`` (series x steps, NaN where null) over ``steps`` (ascending,
    at least one), its aggregates without the flags (0, 0 and None)."""
    import numpy  # with the first batch, not at the API's start (as the reads load it)

    n = len(steps)
    finite = numpy.isfinite(values)
    held = finite.sum(axis=1).tolist()
    # non-finite values out of the running: the first of ties is the earliest step
    low_at = numpy.where(finite, values, numpy.inf).argmin(axis=1)
    high_at = numpy.where(finite, values, -numpy.inf).argmax(axis=1)
    rows_at = numpy.arange(len(values))
    lows = values[rows_at, low_at].tolist()
    highs = values[rows_at, high_at].tolist()
    out: list[Row] = []
    for i, (h, lo, hi) in enumerate(zip(held, low_at.tolist(), high_at.tolist(), strict=True)):
        extremes = (lows[i], steps[lo], highs[i], steps[hi]) if h else _NO_EXTREMES
        out.append((steps[0], steps[-1], n, n - h, 0, 0, None, *extremes))
    return out


_NO_EXTREMES = (None, None, None, None)


def part_blocks(parts: Mapping[Key, Part], rolled_up: Callable[[str, str], bool]) -> dict[Key, Row]:
    """The aggregates (:func:`block_stats`) of every rolled-up step series' part whose steps
    rise, in groups of the parts that share their steps (a chunk's points), by chunk key:
    taken before the write, whose rows take their new values' span from them
    (:func:`~amptrain.store.history.chunk_writes.write`), as the roll-ups take them
    (:func:`gained_blocks`)."""
    import numpy  # with the first batch, not at the API's start (as the reads load it)

    groups: dict[int, list[Key]] = {}
    for key, part in parts.items():
        if key[1] == STEP_KIND and rolled_up(key[1], key[2]):
            groups.setdefault(id(part.steps), []).append(key)
    out: dict[Key, Row] = {}
    for group in groups.values():
        steps = parts[group[0]].steps
        if len(group) < 2 or not all(map(lt, steps, islice(steps, 1, None))):
            continue
        # Each series' float64 values, as the merge takes them too (once a part): a value
        # that is not a number (say, an int beyond a double) leaves its series to the
        # per-series route.
        got = [(key, f[0]) for key in group if (f := floats(parts[key])) is not None]
        if len(got) < 2:
            continue
        values = numpy.frombuffer(b"".join(a for _, a in got)).reshape(len(got), len(steps))
        out.update(zip([key for key, _ in got], block_stats(steps, values), strict=True))
    return out


def gained_blocks(
    gains: Mapping[Key, Gained], parts: Mapping[Key, Part], blocks: Mapping[Key, Row]
) -> dict[Key, Row]:
    """Of the ``blocks`` (:func:`part_blocks`), those of the chunks that gained their whole
    part (an append of rising steps: what each gained is the part, in order)."""
    out: dict[Key, Row] = {}
    for key, row in blocks.items():
        new = gains.get(key)
        if new is not None and len(new) == len(parts[key].steps):
            out[key] = row
    return out
