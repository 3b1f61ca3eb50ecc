"""A chunk's contents after a batch: the stored chunk (if any) with the steps a batch's
part of it brings (:mod:`~amptrain.store.history.chunk_writes` reads, summarises and
writes them). A step already stored, or repeated in the part, keeps its first value, as
``ON CONFLICT DO NOTHING`` did for rows.

Nearly every batch only appends: an attempt records its steps in order, so a chunk's new
steps rise after its stored ones. That case is array concatenation (consecutive steps stay
a ``range``), with no per-value Python work; anything else (a replay, a re-sent or
reordered range, a value that is not a number) takes the general merge, which keeps the
same rules. Standard library only: the recorder does without numpy.
"""

from __future__ import annotations

from array import array
from itertools import islice
from math import isfinite
from operator import lt as _lt
from typing import Any

from amptrain.store.history.chunk_codec import Decoded, Steps
from amptrain.store.history.chunk_parts import Part
from amptrain.store.history.gained import Appended
from amptrain.store.history.gained import Gained as Gained

Stored = tuple[Decoded, float | None, float | None]
"""A stored chunk: its contents and the wall clock of its first and last value (None: a
record that carried no time)."""
Span = tuple[float | None, float | None, int]
"""A chunk's lowest and highest finite value (None: none is) and how many are not finite:
its ``low``, ``high`` and ``non_finite`` columns (:func:`value_range` of its values)."""


def merged(
    part: Part, old: Stored | None, rising: dict[int, bool] | None = None
) -> tuple[Stored, Gained] | None:
    """The chunk ``old`` (None: none stored) with the part's new steps, and those steps;
    None when it gains none (a replay) and no place (a chunk migration 0014 wrote before a
    name's place was kept). ``rising``: whether each steps list (by ``id``) rises strictly,
    kept by the caller across the parts of one batch, which share one steps list per chunk
    of points (every step series): the caller keeps those parts, so their ids stay theirs."""
    m = _appended(part, old, {} if rising is None else rising)
    return _merged(part, old) if m is None else m


def _appended(
    part: Part, old: Stored | None, rising: dict[int, bool]
) -> tuple[Stored, Gained] | None:
    """The common case without per-value work: the part's steps rise strictly, all after the
    stored chunk's last (an attempt records its steps in order), and every value is a
    number. None otherwise (a replay, a resent range, a null): :func:`_merged` decides."""
    steps = part.steps
    if old is not None and old[0].steps and old[0].steps[-1] >= steps[0]:
        return None
    up = rising.get(id(steps))
    if up is None:
        up = rising[id(steps)] = all(map(_lt, steps, islice(steps, 1, None)))
    if not up:
        return None
    got = floats(part)
    if got is None:
        return None
    values, new_nulls = got
    if old is None:
        decoded = Decoded(_extended(range(0), steps), values, new_nulls, part.position)
        return (decoded, part.times[0], part.times[-1]), _gained(part)
    o = old[0]
    nulls = None
    if o.nulls or new_nulls:
        nulls = (o.nulls or bytes(len(o.steps))) + (new_nulls or bytes(len(steps)))
    position = part.position if o.position is None else o.position
    decoded = Decoded(_extended(o.steps, steps), o.values + values, nulls, position)
    return (decoded, old[1], part.times[-1]), _gained(part)


def _gained(part: Part) -> Gained:
    """Every step of a part that only appends is new."""
    return Appended(part.steps, part.values)


def _extended(old: Steps, new: list[int]) -> Steps:
    """``old`` followed by ``new`` (rising, after it): a range while both are consecutive
    (a range ``old`` is; an array may have gaps)."""
    consecutive = isinstance(old, range) and (not old or old[-1] + 1 == new[0])
    if consecutive and new[-1] - new[0] + 1 == len(new):
        return range(old[0] if old else new[0], new[-1] + 1)
    steps = array("q", old)
    steps.extend(new)
    return steps


Floats = tuple["array[float]", bytes | None]
"""Values as float64 (NaN where null) and their null flags (None: no null)."""


def floats(part: Part) -> Floats | None:
    """The part's values as :data:`Floats`; None when one is not a number (a malformed
    entry: :func:`_merged` makes it null). Taken once per part, whose values are complete
    once gathered: the roll-ups' blocks (:func:`~amptrain.store.history.block_stats.part_blocks`)
    and the merge both read them (each took a pass over the values, ~0.5 us a point)."""
    got: Floats | bool | None = part.floats
    if got is False:
        got = part.floats = _numbers(part.values)
    return got  # type: ignore[return-value]


def _numbers(raw: list[Any]) -> Floats | None:
    try:
        return array("d", raw), None
    except (TypeError, OverflowError):
        pass
    nulls = raw.count(None)
    if nulls == len(raw):  # a field this run does not record (memory on a CPU)
        return array("d", [_NAN]) * nulls, b"\x01" * nulls
    try:
        values = array("d", [_NAN if v is None else v for v in raw])
    except (TypeError, OverflowError):
        return None
    return values, bytes([v is None for v in raw]) if nulls else None


def _merged(part: Part, old: Stored | None) -> tuple[Stored, Gained] | None:
    """A chunk with the part's new steps; None when it gains none (a replay) and no place
    (a chunk migration 0014 wrote before a name's place was kept)."""
    have = set(old[0].steps) if old is not None else set()
    new: dict[int, Any] = {}
    times: dict[int, float | None] = {}
    for step, value, at in zip(part.steps, part.values, part.times, strict=True):
        if step not in have and step not in new:
            new[step] = value
            times[step] = at
    position = part.position if old is None or old[0].position is None else old[0].position
    if not new and (old is None or old[0].position == position):
        return None
    entries = list(new.items())
    t_first = times[min(new)] if new else None
    t_last = times[max(new)] if new else None
    if old is not None:
        o = old[0]
        nulls = o.nulls or bytes(len(o.steps))
        entries += [
            (step, None if null else v)
            for step, v, null in zip(o.steps, o.values, nulls, strict=True)
        ]
        t_first = old[1] if not new or o.steps[0] < min(new) else t_first
        t_last = old[2] if not new or o.steps[-1] > max(new) else t_last
    entries.sort(key=_first)
    steps = array("q", [e[0] for e in entries])
    try:
        values = array("d", [_NAN if e[1] is None else e[1] for e in entries])
    except (TypeError, OverflowError):
        # Not a number (a malformed entry that took the decoder's generic route): null,
        # rather than a batch that fails at every retry.
        entries = [(step, number(v)) for step, v in entries]
        values = array("d", [_NAN if e[1] is None else e[1] for e in entries])
    flags = bytes([e[1] is None for e in entries])
    return (Decoded(steps, values, flags if any(flags) else None, position), t_first, t_last), new


_NAN = float("nan")


def number(v: Any) -> float | None:
    """A stored value as the chunks hold it: a float, or None (null, or not a number)."""
    if type(v) not in (int, float, bool):
        return None
    try:
        return float(v)
    except OverflowError:
        return None


def _first(entry: tuple[int, Any]) -> int:
    return entry[0]


def merged_span(
    d: Decoded, old: Stored | None, stored: Span | None, new: Span | None = None
) -> Span:
    """The merged chunk ``d``'s :data:`Span`: when it begins with every value of ``old``
    unchanged (an append, nearly every batch), ``old``'s ``stored`` span (its columns; None:
    not known) combined with the new values' span, so that an open chunk rewritten by each
    batch is not rescanned whole; else its values'. A chunk gains steps and keeps each step's
    first value, so when ``d``'s step at ``old``'s length - 1 is ``old``'s last step, ``d``
    begins with ``old``'s values. ``new``: the span of the values ``d`` gained after
    ``old``'s (all of them when ``old`` is None) when the caller knows it, instead of a
    pass over them."""
    if old is None and new is not None:
        return new
    if stored is None or old is None:
        return value_range(d.values)
    n = len(old[0].steps)
    if not n or len(d.steps) <= n or d.steps[n - 1] != old[0].steps[-1]:
        return value_range(d.values)
    low, high, non_finite = value_range(d.values[n:]) if new is None else new
    old_low, old_high, old_non_finite = stored
    # Ties: the earlier (stored) value wins, as min and max over the whole chunk pick it.
    if old_low is not None and old_high is not None:
        low = old_low if low is None or not low < old_low else low
        high = old_high if high is None or not high > old_high else high
    return low, high, non_finite + old_non_finite


def value_range(values: array[float]) -> tuple[float | None, float | None, int]:
    """The lowest and highest finite value (None: none is) and how many are not finite
    (NaN, a null, an infinity). A finite sum means every value is finite: then min and max
    are two loops in C, not a list of the finite ones."""
    if isfinite(sum(values)):
        return min(values), max(values), 0
    finite = list(filter(isfinite, values))
    if not finite:
        return None, None, len(values)
    return min(finite), max(finite), len(values) - len(finite)
