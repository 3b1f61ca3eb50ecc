"""A job's evaluations (or per-layer gradient norms) in at most ``max_points``: the named
series of one kind downsampled by the rules of the step metrics
(:mod:`amptrain.store.history.window`), from the chunks' roll-ups.

The steps from ``from_step`` to ``to_step`` fall into aligned buckets of one width of the
fixed ladder (:func:`~amptrain.store.history.window.width_for`, the one series_window
uses); per bucket the first and the last evaluation are kept and, for each metric name,
the evaluation holding its minimum and the one holding its maximum (a spike in accuracy or
eval loss survives any zoom). Layer norms, up to
:data:`~amptrain.contract.layers.LAYER_NORMS_MAX` names, keep per bucket the first, the
last and the step of the bucket's highest norm of any layer (a spike in any layer survives;
a minimum and maximum per layer would leave room for a few buckets only). A window that
holds at most ``max_points`` records comes back whole. Always the effective series (per
step and name, the newest attempt's value).

Where the aggregates come from: each name's roll-ups where one attempt alone recorded the
steps, its decoded chunks where a bucket cuts a chunk or attempts overlap
(:mod:`~amptrain.store.history.chunk_cover`, :func:`~amptrain.store.history.chunk_stats.
series_stats`); the records are counted by the ``@ms`` series (one value per record). Only
the chosen steps' chunks are decoded whole, so a read's cost follows the buckets, not the
run's length, and every statement walks a primary key (no plan depends on statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history import chunk_index
from amptrain.store.history.chunk_cover import Raw, attempt_runs, attempt_runs_of, pieces
from amptrain.store.history.chunk_parts import MS, RESERVED, SHIFT
from amptrain.store.history.rollups import Stats
from amptrain.store.history.values import newest_cursor
from amptrain.store.history.window import cursor_text, width_for

if TYPE_CHECKING:
    from amptrain.store.history.chunk_reads import Records

_ALL_STEPS = (0, (1 << 62) - 1)
"""A window's steps when the request names no bound."""


@dataclass
class EvalWindow:
    items: list[dict[str, Any]]
    """Evaluations in step order, as ``eval_page`` gives them, each with ``downsampled``."""
    next_cursor: str | None
    """The newest recorded evaluation's cursor (of the whole run): follow it from there."""


def eval_window(
    s: Session,
    job_id: str,
    max_points: int,
    from_step: int | None = None,
    to_step: int | None = None,
    kind: str = EVAL_KIND,
) -> EvalWindow:
    """At most ``max_points`` ``kind`` records of steps ``from_step..to_step`` (default:
    all)."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    # numpy with the first read, not at the API's start (amptrain.store.history.points).
    import numpy

    from amptrain.store.history import chunk_reads, layer_buckets
    from amptrain.store.history.chunk_stats import series_stats

    first = _ALL_STEPS[0] if from_step is None else from_step
    last = _ALL_STEPS[1] if to_step is None else to_step
    newest = cursor_text(newest_cursor(s, job_id, kind))
    names = [n for n in chunk_index.names(s, job_id, kind) if not n.startswith(RESERVED)]
    span, count = _records_held(s, job_id, kind, names, first, last)
    if count <= max_points:
        chunks = chunk_index.chunks_between(s, job_id, kind, first >> SHIFT, last >> SHIFT)
        rec = chunk_reads.in_chunks(s, job_id, kind, chunks, names, effective=True)
        rec = rec.take((rec.steps >= first) & (rec.steps <= last))
        rec = rec.take(numpy.lexsort((rec.seq, rec.ms, rec.steps)))
        return EvalWindow(_marked(s, rec, downsampled=False), newest)
    lo, hi = span.first_step, span.last_step
    per_name = kind == EVAL_KIND
    runs = attempt_runs_of(s, job_id, kind, names)
    if per_name:  # the names holding a value in the window decide each bucket's share
        (held,) = series_stats(s, job_id, kind, runs, [(lo, hi)])
        runs = {n: runs[n] for n in names if held[n].count}
    width = width_for(lo, hi, max_points, 2 + 2 * len(runs) if per_name else 3)
    ranges = [
        (max(lo, b * width), min(hi, (b + 1) * width - 1))
        for b in range(lo // width, hi // width + 1)
    ]
    if per_name:
        chosen = _chosen_steps(series_stats(s, job_id, kind, runs, ranges))
    else:  # three steps a bucket, folded over every name at once
        chosen = layer_buckets.kept_steps(s, job_id, kind, runs, ranges)
    rec = chunk_reads.by_steps(s, job_id, kind, sorted(chosen), names, effective=True)
    items = _marked(s, rec, downsampled=True)
    if len(items) > max_points:  # a budget below one bucket's share, or re-evaluated steps
        items = most_telling(items, max_points)
    return EvalWindow(sorted(items, key=position), newest)


def _records_held(
    s: Session, job_id: str, kind: str, names: list[str], first: int, last: int
) -> tuple[Stats, int]:
    """The aggregates of the steps ``first..last`` holding a record (the first and last such
    step) and how many effective records they hold: one per step (the ``@ms`` series'
    effective count) plus, in the chunks where attempts overlap, the older attempts'
    records that still hold a name no newer attempt re-recorded."""
    import numpy

    from amptrain.store.history import chunk_reads
    from amptrain.store.history.chunk_stats import series_stats

    runs = attempt_runs(s, job_id, kind, MS)
    (held,) = series_stats(s, job_id, kind, {MS: runs}, [(first, last)])
    contested = [p for p in pieces(runs, first, last) if isinstance(p, Raw) and len(p.attempts) > 1]
    count = held[MS].count
    if contested:
        chunks = sorted({p.chunk for p in contested})
        rec = chunk_reads.in_chunks(s, job_id, kind, chunks, names, effective=True)
        steps = rec.steps[(rec.steps >= first) & (rec.steps <= last)]
        count += len(steps) - len(numpy.unique(steps))
    return held[MS], count


def _chosen_steps(buckets: list[dict[str, Stats]]) -> set[int]:
    """Per bucket: its first and last step and, per name, where its min and max are first
    held."""
    chosen: set[int] = set()
    for totals in buckets:
        held = [t for t in totals.values() if t.count]
        if not held:
            continue
        chosen.add(min(t.first_step for t in held))
        chosen.add(max(t.last_step for t in held))
        chosen.update(x for t in held for x in (t.low_step, t.high_step) if x is not None)
    return chosen


def _marked(s: Session, rec: Records, *, downsampled: bool) -> list[dict[str, Any]]:
    from amptrain.store.history import chunk_pages

    items = chunk_pages.named_items(rec, chunk_pages.nan_is_null(s))
    for item in items:
        item["downsampled"] = downsampled
    return items


def position(item: dict[str, Any]) -> tuple[int, int, int]:
    """An item's place in a window: its step, then its cursor."""
    ms, seq = item["cursor"].split("-")
    return item["step"], int(ms), int(seq)


def most_telling(items: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """For a budget smaller than one bucket's evaluations: each name's highest value first,
    then each name's lowest, the last and the first evaluation (as for the step metrics)."""
    names = sorted({name for item in items for name in item["values"]})
    highs: list[int] = []
    lows: list[int] = []
    for name in names:
        ranked = sorted(
            (item["values"][name], k)
            for k, item in enumerate(items)
            if item["values"].get(name) is not None
        )
        if ranked:
            highs.append(ranked[-1][1])
            lows.append(ranked[0][1])
    picked = list(dict.fromkeys([*highs, *lows, len(items) - 1, 0]))
    return [items[k] for k in picked[:n]]
