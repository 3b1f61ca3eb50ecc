"""The pieces every downsampled read shares (:mod:`amptrain.store.history.downsample` and
the evaluations' :mod:`amptrain.store.history.eval_window`, both from the chunks' roll-ups;
the test oracles of tests/support/): what a window holds, which points count as flagged,
which fields a request keeps, the fixed ladder of bucket widths and the window's budget of
points, and how the chosen steps become items."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from amptrain.contract.cursor import Cursor
from amptrain.contract.metrics import EXTREMA_FIELDS, METRIC_FIELDS

DEFAULT_EXTREMA = ("loss", "grad_norm")
"""Whose extremes are kept when a request names no fields."""


@dataclass
class Window:
    items: list[dict[str, Any]]
    """Points in step order; each has ``downsampled`` (false: every point of the window)
    and, when downsampled, ``bucket_last``: whether it is its bucket's last point (one per
    bucket, evenly spaced, unlike the min/max kept for spikes: what a smoothed line reads)."""
    next_cursor: str | None
    """The newest recorded point's cursor (of the whole run): follow the run from there."""
    marks: list[dict[str, int]] = field(default_factory=list)
    """Buckets holding flagged steps: ``from_step``, ``to_step`` and how many steps there are
    ``flagged`` in all, ``skipped`` and ``non_finite`` (a step can be both)."""


def parse_fields(text: str | None) -> list[str] | None:
    """``"loss,lr"`` -> ``["loss", "lr"]`` (None = all); ValueError naming unknown fields."""
    if not text:
        return None
    wanted = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in wanted if f not in METRIC_FIELDS]
    if unknown:
        raise ValueError(
            f"unknown fields {', '.join(unknown)}; expected some of {', '.join(METRIC_FIELDS)}"
        )
    return wanted


def select_fields(item: dict[str, Any], fields: Sequence[str] | None) -> dict[str, Any]:
    """Keep ``step``, ``attempt``, ``cursor`` (and ``downsampled``) plus the wanted fields."""
    if fields is None:
        return item
    keep = {"step", "attempt", "cursor", "downsampled", *fields}
    return {k: v for k, v in item.items() if k in keep}


def extrema_of(fields: Sequence[str] | None) -> tuple[str, ...]:
    """The fields whose per-bucket min and max a request keeps."""
    if fields is None:
        return DEFAULT_EXTREMA
    return tuple(f for f in fields if f in EXTREMA_FIELDS)


def needed(fields: Sequence[str] | None, extrema: tuple[str, ...]) -> list[str] | None:
    """The fields :func:`finish` needs in the chosen steps' items besides ``fields`` (None:
    all): what :func:`_most_telling` ranks and flags by."""
    if fields is None:
        return None
    return list(dict.fromkeys((*fields, "loss", "skipped", *extrema)))


def finish(
    items: list[dict[str, Any]],
    lasts: set[int],
    marks: list[dict[str, int]],
    max_points: int,
    extrema: tuple[str, ...],
    fields: Sequence[str] | None,
    newest: str | None,
) -> Window:
    """The chosen steps' items (in step order, holding the :func:`needed` fields, non-finite
    numbers null) as the window; ``lasts``: each bucket's last step."""
    if len(items) > max_points:  # only when a bucket holds more (see window_width)
        items = _most_telling(items, max_points, extrema)
    if fields is not None:  # drop what only the ranking needed
        items = [select_fields(item, fields) for item in items]
    for item in items:
        item["bucket_last"] = item["step"] in lasts
    return Window(items, newest, marks)


def window_width(lo: int, hi: int, max_points: int, extrema: tuple[str, ...]) -> int:
    """The bucket width that shows steps lo..hi in at most ``max_points`` points: a bucket
    keeps its first, last and first flagged step and where each field of ``extrema`` has
    its minimum and maximum."""
    return width_for(lo, hi, max_points, 3 + 2 * len(extrema))


def width_for(lo: int, hi: int, max_points: int, per_bucket: int) -> int:
    """The bucket width that shows steps lo..hi in at most ``max_points`` items when each
    bucket keeps at most ``per_bucket`` of them (the step metrics': :func:`window_width`;
    the evaluations': :mod:`amptrain.store.history.eval_window`)."""
    return bucket_width(lo, hi, max(1, max_points // per_bucket))


def room_for_every_flagged(steps: set[int], marks: list[dict[str, int]], max_points: int) -> bool:
    """Whether the window has room for every flagged step besides the ``steps`` chosen,
    which hold each marked bucket's first flagged step already."""
    n_flagged = sum(m["flagged"] for m in marks)
    return n_flagged > len(marks) and len(steps) + n_flagged - len(marks) <= max_points


def bucket_width(lo: int, hi: int, buckets: int) -> int:
    """The smallest width of the fixed ladder 1, 2, ..., 7, then m * 2**k for m in 4, 5, 6,
    7 (8, 10, 12, 14, 16, 20, ...; quarter-octave rungs, losing at most 25% of the
    resolution) such that steps lo..hi span at most ``buckets`` aligned buckets
    (``step // width``). A fixed ladder keeps a growing run's buckets until it needs the
    next rung; rungs of that form make every bucket of a width >= 2**(BASE+2) a union of
    aligned summary nodes of one level."""
    for width in _ladder():
        if hi // width - lo // width + 1 <= buckets:
            return width
    raise AssertionError("unreachable: the ladder is unbounded")


def _ladder() -> Iterator[int]:
    yield from range(1, 8)
    k = 1
    while True:
        for m in (4, 5, 6, 7):
            yield m << k
        k += 1


def _most_telling(items: list[dict[str, Any]], n: int, extrema: tuple[str, ...]) -> list[Any]:
    """For a budget smaller than one bucket's points: each field's spike (highest value)
    first, then the flagged steps, the lows, the last and the first point."""
    highs: list[dict[str, Any]] = []
    lows: list[dict[str, Any]] = []
    for f in extrema:
        ranked = sorted((r for r in items if _finite(r[f])), key=itemgetter(f))
        if ranked:
            highs.append(ranked[-1])
            lows.append(ranked[0])
    flags = [r for r in items if r["skipped"] or not _finite(r["loss"])]
    picked: list[dict[str, Any]] = []
    for r in [*highs, *flags, *lows, items[-1], items[0]]:
        if r not in picked:
            picked.append(r)
    return sorted(picked[:n], key=itemgetter("step"))


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def cursor_text(cursor: Cursor | None) -> str | None:
    return None if cursor is None else str(cursor)


def runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ints as inclusive runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] + 1 == i:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs
