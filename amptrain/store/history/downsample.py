"""A run's metric series (or a window of its steps) in at most N points, computed by the
database, honest about spikes, NaN/Inf and skipped steps.

Per bucket of steps these points survive: the first and the last, the lowest and the
highest finite value of each requested field that can spike (:data:`EXTREMA_FIELDS`;
``loss`` and ``grad_norm`` when no fields are named), so a loss or grad-norm spike stays
visible at any zoom; and the first flagged step: skipped (``skipped`` true) or
non-finite (a ``loss`` that is null, NaN or infinite, a ``grad_norm`` that is NaN or
infinite). When the budget has room, every flagged step is kept; either way
:attr:`Window.marks` tells per bucket how many it holds, so nothing is dropped silently. A null loss counts as non-finite: SQLite
stores NaN as NULL, JSON has no NaN, and the engine always reports a loss.
Each item says whether it is its bucket's last point (``bucket_last``): a smoothed line
reads those, one per bucket, rather than the extremes, which would keep it looking raw.

Buckets are aligned to multiples of a width taken from a fixed ladder, so a growing run
keeps its buckets (and the points chosen in them) until it needs the next rung: a
refreshing chart does not jump. ``from_step``/``to_step`` restrict everything to a
window, which a zoomed chart fetches at full resolution when it fits.

Where the buckets come from: the chunks' roll-ups (:mod:`amptrain.store.history.rollups`)
of the loss (counts, flags, the first flagged step) and of each field whose extremes are
kept, plus the few chunks decoded at a window's cut edges and where a retry's attempts
overlap (:mod:`amptrain.store.history.chunk_cover`): a read of a 10M-step run visits a few
hundred rows, whatever the planner knows. Then the chosen steps' points: a step chosen
from a whole roll-up block from the block's exemplar (its full record, kept with the
roll-up: :mod:`amptrain.store.history.exemplar_reads`), the others from the chunks
(:func:`~amptrain.store.history.chunk_pages.window_at`: a value's bytes each, not whole
chunks decoded; a full-resolution window decodes its chunks whole,
:func:`~amptrain.store.history.chunk_pages.window_between`).

Retried jobs use the effective series (per step, the newest attempt's point), as
``GET /jobs/{id}/metrics`` does by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from amptrain.store.history.chunk_cover import attempt_runs
from amptrain.store.history.chunk_writes import STEP_KIND
from amptrain.store.history.points import newest_cursor
from amptrain.store.history.rollups import Stats
from amptrain.store.history.window import (
    Window,
    cursor_text,
    extrema_of,
    finish,
    needed,
    room_for_every_flagged,
    window_width,
)

STEP_END = 2**31 - 1


def downsample(
    s: Session, job_id: str, max_points: int, fields: Sequence[str] | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """The whole run in at most ``max_points`` points and the newest point's cursor."""
    window = series_window(s, job_id, max_points, fields)
    return window.items, window.next_cursor


def series_window(
    s: Session,
    job_id: str,
    max_points: int,
    fields: Sequence[str] | None = None,
    from_step: int | None = None,
    to_step: int | None = None,
) -> Window:
    """At most ``max_points`` points of steps ``from_step..to_step`` (default: all)."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    # numpy decodes the chunks: loaded by the first read, not when the API starts (the
    # recorder, in the same process, stays free of it).
    from amptrain.store.history import exemplar_reads
    from amptrain.store.history.chunk_pages import window_between
    from amptrain.store.history.chunk_stats import KEY_SERIES, flagged_steps, range_stats

    newest = cursor_text(newest_cursor(s, job_id))
    runs = attempt_runs(s, job_id, STEP_KIND, KEY_SERIES)
    first = 0 if from_step is None else from_step
    last = STEP_END if to_step is None else to_step
    (total,) = range_stats(s, job_id, runs, [KEY_SERIES], [(first, last)])
    count = total[KEY_SERIES].count
    if not count:
        return Window([], newest)
    lo, hi = total[KEY_SERIES].first_step, total[KEY_SERIES].last_step
    if count <= max_points:  # the steps held, not the window asked (which may be unbounded)
        return Window(window_between(s, job_id, lo, hi, fields), newest)
    extrema = extrema_of(fields)
    width = window_width(lo, hi, max_points, extrema)
    ranges = [
        (max(lo, b * width), min(hi, b * width + width - 1))
        for b in range(lo // width, hi // width + 1)
    ]
    names = list(dict.fromkeys((KEY_SERIES, *extrema)))
    aggs = [a for a in range_stats(s, job_id, runs, names, ranges) if a[KEY_SERIES].count]
    steps, marks = _choose(aggs, extrema, KEY_SERIES)
    if room_for_every_flagged(steps, marks, max_points):  # not just each bucket's first
        steps |= flagged_steps(s, job_id, runs, lo, hi)
    lasts = {a[KEY_SERIES].last_step for a in aggs}
    items = exemplar_reads.window_at(
        s, job_id, runs, ranges, sorted(steps), needed(fields, extrema)
    )
    return finish(items, lasts, marks, max_points, extrema, fields, newest)


def _choose(
    aggs: list[dict[str, Stats]], extrema: tuple[str, ...], key_series: str
) -> tuple[set[int], list[dict[str, int]]]:
    """Per bucket's aggregates (of buckets holding points): the steps it keeps, and its
    mark when it holds flagged steps."""
    chosen: set[int] = set()
    marks: list[dict[str, int]] = []
    for a in aggs:
        key = a[key_series]
        chosen.update((key.first_step, key.last_step))
        for f in extrema:
            chosen.update(v for v in (a[f].low_step, a[f].high_step) if v is not None)
        if key.first_flag is not None:
            chosen.add(key.first_flag)
            marks.append(
                {
                    "from_step": key.first_step,
                    "to_step": key.last_step,
                    "flagged": key.flagged,
                    "skipped": key.skipped,
                    "non_finite": key.non_finite,
                }
            )
    return chosen, marks
