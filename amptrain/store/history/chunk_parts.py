"""Which chunk each recorded value goes to: the series of a batch, the metric table's and the
reserved ones that rebuild a record exactly (its cursor, time and per-rank memory).

The reserved series are named here and only here: a ``@`` prefix that no name of the metric
table can take (step fields are identifiers, evaluation names start with a letter, layer
paths are letters, digits, ``_`` and ``.`` or ``(root)``).

- Step kind: :data:`MS` and :data:`SEQ`, every point's stream cursor (a float64 is exact
  below 2**53: a millisecond clock and a sequence number are far below); :data:`RANKS`,
  the length of ``memory_peak_per_rank`` at the steps that have one, and :func:`rank`
  ``i``, rank ``i``'s value, for ``i`` below :data:`~amptrain.contract.spec.MAX_DEVICES`.
- Each named kind: :data:`MS`, :data:`SEQ` and :data:`TIME` once per record (not per name),
  and every name's chunk keeps the name's place in its record (the order a page lists it).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from amptrain.contract.metrics import STEP_METRICS
from amptrain.contract.spec import MAX_DEVICES
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.point_columns import PointColumns

STEP_KIND = "step"
"""``metric_chunks.kind`` of the per-step fields (the named series use their own kinds)."""
STEP_SERIES: tuple[str, ...] = tuple(
    m.name for m in STEP_METRICS if m.name != "step" and m.type in ("int", "float", "bool", "bytes")
)
"""The per-step fields stored as series, in the metric table's order."""
KEY_SERIES = "loss"
"""The step series whose roll-ups count a window's points (every point writes it, a null
loss too), whose non-finite values are what a mark's ``non_finite`` counts, and whose
roll-ups carry the flags."""
RESERVED = "@"
"""The prefix of every reserved series."""
MS = "@ms"
SEQ = "@seq"
TIME = "@time"
RANKS = "@ranks"
RECORD_SERIES = (MS, SEQ, TIME)
"""A named kind's series of its records (one value per record)."""
POSITION_MAX = 65_535
"""A name's place is kept as a uint16 (a record holds far fewer names)."""
SHIFT = CHUNK_STEPS.bit_length() - 1


def rank(i: int) -> str:
    """The series of rank ``i``'s ``memory_peak_per_rank`` value."""
    return f"@rank{i}"


RANK_SERIES = tuple(rank(i) for i in range(MAX_DEVICES))
"""A job's data-parallel processes are at most MAX_DEVICES, so are its rank series."""

Key = tuple[str, str, str, int, int]
"""``(job_id, kind, name, chunk, attempt)``: a chunk's primary key."""


def rolled_up(kind: str, name: str) -> bool:
    """Whether a series keeps roll-ups (``metric_rollups``): every series of the metric
    table, and a named kind's :data:`MS`, which counts its records (``eval_window``). No
    read takes the other reserved series' roll-ups (their values come from the chunks and
    the exemplars), so neither the recorder nor the rebuild makes them: a step point's
    ``@ms`` and ``@seq`` were 2 of its 13 series' upkeep. Ones written before stay, unread."""
    return not name.startswith(RESERVED) or (kind != STEP_KIND and name == MS)


class Part:
    """New values of one chunk, in arrival order: steps, values (None = null), times, and a
    named series' place in its record."""

    __slots__ = ("floats", "position", "steps", "times", "values")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[Any] = []
        self.times: list[float | None] = []
        self.position: int | None = None
        self.floats: Any = False
        """The values as float64, once taken (False: not yet): see
        :func:`~amptrain.store.history.chunk_merge.floats`."""

    def add(self, step: int, value: Any, at: float | None) -> None:
        self.steps.append(step)
        self.values.append(value)
        self.times.append(at)


def collect(
    points: Iterable[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]],
    step_fields: Sequence[str] = STEP_SERIES,
    columns: Iterable[PointColumns] = (),
) -> dict[Key, Part]:
    """The parts of every chunk the points (``job_id``, ``attempt``, ``step``, ``time``, the
    step fields, and with ``stream_ms``/``stream_seq`` their cursor), the points given as
    ``columns`` (the recorder's plain points: the same parts, by slicing) and the named
    values (``job_id``, ``attempt``, ``step``, ``kind``, ``name``, ``value``, ``time``, a
    cursor, each record's values together) reach; ``step_fields``: the metric table's
    series to write (none: only the reserved ones)."""
    parts: dict[Key, Part] = {}
    for c in columns:
        _column_parts(parts, c, step_fields)
    groups: dict[tuple[str, int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for p in points:
        groups[(p["job_id"], p["step"] >> SHIFT, p["attempt"])].append(p)
    for (job_id, chunk, attempt), group in groups.items():
        steps = [p["step"] for p in group]
        times = [p["time"] for p in group]
        for name, column in zip(step_fields, _columns(group, step_fields), strict=True):
            part = parts[(job_id, STEP_KIND, name, chunk, attempt)] = Part()
            part.steps, part.times = steps, times
            part.values = column
        if "stream_ms" in group[0]:
            _point_records(parts, (job_id, chunk, attempt), group, steps, times)
    _values_into(parts, values)
    return parts


def _column_parts(parts: dict[Key, Part], c: PointColumns, step_fields: Sequence[str]) -> None:
    """The parts of one job's columns: per (chunk, attempt) in order of first appearance,
    each series' values over its points in stream order, as :func:`collect` groups rows.
    A job's points of a chunk and attempt are nearly always one run of the stream: a
    slice of each column; else the run's indices pick them. Plain entries never carry
    ``memory_peak_per_rank`` (a data-parallel point takes the per-entry route)."""
    keys = list(zip([step >> SHIFT for step in c.steps], c.attempts, strict=True))
    cuts = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    runs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for start, stop in zip([0, *cuts], [*cuts, len(keys)], strict=True):
        if start < stop:
            runs.setdefault(keys[start], []).append((start, stop))
    named = [(MS, c.stream_ms), (SEQ, c.stream_seq)]
    columns = [(name, c.column(name)) for name in step_fields]
    for (chunk, attempt), spans in runs.items():
        if len(spans) == 1:
            ((start, stop),) = spans
            pick: Callable[[Sequence[Any]], list[Any]] = itemgetter(slice(start, stop))
        else:
            at = [i for start, stop in spans for i in range(start, stop)]
            pick = _picker(at)
        steps, times = pick(c.steps), pick(c.column("time"))
        for name, column in (*columns, *named):
            part = parts[(c.job_id, STEP_KIND, name, chunk, attempt)] = Part()
            part.steps, part.times = steps, times
            part.values = pick(column)


def _picker(at: list[int]) -> Callable[[Sequence[Any]], list[Any]]:
    def pick(column: Sequence[Any]) -> list[Any]:
        return [column[i] for i in at]

    return pick


def _columns(group: list[Mapping[str, Any]], names: Sequence[str]) -> list[list[Any]]:
    """Each named field's values over the group (None where a point lacks it): the recorder's
    points hold every field, so one itemgetter a point and one transpose, in C, instead of
    a Python loop turn per value."""
    if len(names) > 1:
        try:
            return list(map(list, zip(*map(itemgetter(*names), group), strict=True)))
        except KeyError:
            pass  # a row without some field (a migration's, a test's)
    return [[p.get(name) for p in group] for name in names]


def _point_records(
    parts: dict[Key, Part],
    at: tuple[str, int, int],
    group: list[Mapping[str, Any]],
    steps: list[int],
    times: list[float | None],
) -> None:
    job_id, chunk, attempt = at
    for name, field in ((MS, "stream_ms"), (SEQ, "stream_seq")):
        part = parts[(job_id, STEP_KIND, name, chunk, attempt)] = Part()
        part.steps, part.times = steps, times
        part.values = [p[field] for p in group]
    # Only a data-parallel run's points carry the list (a one-device point: null).
    for p in [p for p in group if p.get("memory_peak_per_rank") is not None]:
        ranks = memory_ranks(p["memory_peak_per_rank"])
        if ranks is None:
            continue
        step, at_time = p["step"], p["time"]
        for name, value in ((RANKS, len(ranks)), *((rank(i), v) for i, v in enumerate(ranks))):
            key = (job_id, STEP_KIND, name, chunk, attempt)
            found = parts.get(key)
            if found is None:
                found = parts[key] = Part()
            found.add(step, value, at_time)


def memory_ranks(value: Any) -> list[int] | None:
    """``memory_peak_per_rank`` as a list (the recorder carries JSON text, a database row a
    list or text); None when absent or longer than the ranks a job can have (the recorder
    stores such a malformed list as null, :mod:`amptrain.server.recorder.entries`)."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list) or len(value) > MAX_DEVICES:
        return None
    return value


def _values_into(parts: dict[Key, Part], values: Sequence[Mapping[str, Any]]) -> None:
    record: tuple[Any, ...] | None = None
    position = 0
    for v in values:
        job_id, kind, step, attempt = v["job_id"], v["kind"], v["step"], v["attempt"]
        chunk = step >> SHIFT
        # A record's values arrive together, in its order: a new record starts position 0.
        this = (job_id, kind, step, attempt, v.get("stream_ms"), v.get("stream_seq"))
        position = position + 1 if this == record else 0
        key = (job_id, kind, v["name"], chunk, attempt)
        part = parts.get(key)
        if part is None:
            part = parts[key] = Part()
            part.position = min(position, POSITION_MAX)
        part.add(step, v["value"], v["time"])
        if this != record and v.get("stream_ms") is not None:
            for name, value in zip(
                RECORD_SERIES, (v["stream_ms"], v["stream_seq"], v["time"]), strict=True
            ):
                rkey = (job_id, kind, name, chunk, attempt)
                rpart = parts.get(rkey)
                if rpart is None:
                    rpart = parts[rkey] = Part()
                rpart.add(step, value, v["time"])
        record = this
