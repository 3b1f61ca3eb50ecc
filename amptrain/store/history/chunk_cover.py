"""Which stored pieces hold a step range of a job's EFFECTIVE series (per step the newest
attempt's value): roll-ups where one attempt alone recorded the steps, decoded chunks
where attempts overlap or a range cuts a chunk.

The rule: an attempt records consecutive steps from its resume point, so its *span* (its
first and last recorded step, from its level-8 roll-ups) bounds all it holds. A chunk
whose steps meet one attempt's span holds that attempt's values alone: its roll-ups (and
the roll-ups of any aligned block of such chunks) ARE the effective series' aggregates. A
chunk that meets two or more spans (where a retry resumed from an earlier checkpoint and
re-recorded steps, or stopped before its predecessor's last step) is *contested*: its
chunks of every such attempt are decoded and merged per step, the newest attempt winning,
so the result is exact even for an attempt with gaps. Only the chunks around a resume
point are contested; the rest of a retried run reads as fast as a run of one attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.rollups import LEVELS

_SHIFT = CHUNK_STEPS.bit_length() - 1


@dataclass(frozen=True, slots=True)
class Node:
    """A roll-up of one attempt: level and index (``chunk >> level``)."""

    attempt: int
    level: int
    idx: int


@dataclass(frozen=True, slots=True)
class Raw:
    """Steps ``first..last`` of one chunk, decoded from the chunks of ``attempts``."""

    attempts: tuple[int, ...]
    chunk: int
    first: int
    last: int


Piece = Node | Raw
Run = tuple[int, int, tuple[int, ...]]
"""Chunks ``lo..hi`` and the attempts whose spans meet each of them."""


def attempt_runs(s: Session, job_id: str, kind: str, name: str) -> list[Run]:
    """The job's chunk indexes in runs of the same attempts (one: owned; more: contested),
    from the series ``kind``/``name``'s top roll-ups: a row per 65,536 steps. The
    statement of :func:`attempt_runs_of`: an ORM select cost 3-6 ms of every downsampled
    read, and its first compile in a process ~25 ms more (a cold read)."""
    return attempt_runs_of(s, job_id, kind, [name])[name]


def attempt_runs_of(
    s: Session, job_id: str, kind: str, names: Sequence[str]
) -> dict[str, list[Run]]:
    """:func:`attempt_runs` of each of ``names``: one statement, an index range of the top
    roll-ups per name (a layer-norm window has up to 256 names: a statement each cost more
    than the rest of the read)."""
    if not names:
        return {}
    params = {"job": job_id, "kind": kind, "names": list(names), "level": max(LEVELS)}
    sql = _SPANS_PG if s.get_bind().dialect.name == "postgresql" else _SPANS
    spans: dict[str, list[tuple[int, int, int]]] = {n: [] for n in names}
    for name, attempt, lo, hi in s.execute(sql, params):
        spans[name].append((attempt, lo, hi))
    return {n: _runs(found) for n, found in spans.items()}


# Per name a LATERAL range of the primary key (job, kind, name, level, ...), OFFSET 0 keeping
# it one whatever the planner knows (a flattened join may scan the kind's every roll-up).
_SPANS_PG = sa.text(
    "SELECT k.name, r.attempt, r.lo, r.hi FROM unnest(CAST(:names AS text[])) AS k(name) "
    "CROSS JOIN LATERAL (SELECT attempt, min(first_step) AS lo, max(last_step) AS hi "
    "FROM metric_rollups WHERE job_id = :job AND kind = :kind AND name = k.name "
    "AND level = :level GROUP BY attempt OFFSET 0) AS r"
)
_SPANS = sa.text(
    "SELECT name, attempt, min(first_step), max(last_step) FROM metric_rollups "
    "WHERE job_id = :job AND kind = :kind AND name IN :names AND level = :level "
    "GROUP BY name, attempt"
).bindparams(sa.bindparam("names", expanding=True))


def _runs(spans: list[tuple[int, int, int]]) -> list[Run]:
    """Attempts' step spans ``(attempt, first, last)`` as runs of chunks."""
    chunk_spans = [(a, lo >> _SHIFT, hi >> _SHIFT) for a, lo, hi in spans]
    cuts = sorted({lo for _, lo, _ in chunk_spans} | {hi + 1 for _, _, hi in chunk_spans})
    runs: list[Run] = []
    for lo, end in pairwise(cuts):
        held = tuple(sorted(a for a, a_lo, a_hi in chunk_spans if a_lo <= lo and end - 1 <= a_hi))
        if held:
            runs.append((lo, end - 1, held))
    return runs


def pieces(runs: list[Run], first: int, last: int) -> list[Piece]:
    """Steps ``first..last`` of the effective series as the fewest roll-ups and decoded
    chunk parts, in step order."""
    out: list[Piece] = []
    for lo, hi, attempts in runs:
        a = max(first, lo << _SHIFT)
        b = min(last, ((hi + 1) << _SHIFT) - 1)
        if a > b:
            continue
        if len(attempts) > 1:
            out += [
                Raw(attempts, c, max(a, c << _SHIFT), min(b, ((c + 1) << _SHIFT) - 1))
                for c in range(a >> _SHIFT, (b >> _SHIFT) + 1)
            ]
        else:
            out += _cover(attempts[0], a, b)
    return out


def _cover(attempt: int, first: int, last: int) -> list[Piece]:
    """One attempt's steps ``first..last``: the whole chunks as the largest aligned roll-ups,
    the cut chunks at either end as decoded parts."""
    start = -(-first >> _SHIFT)  # the first whole chunk
    stop = (last + 1) >> _SHIFT  # past the last whole chunk
    if start >= stop:
        return [
            Raw((attempt,), c, max(first, c << _SHIFT), min(last, ((c + 1) << _SHIFT) - 1))
            for c in range(first >> _SHIFT, (last >> _SHIFT) + 1)
        ]
    out: list[Piece] = []
    if first < start << _SHIFT:
        out.append(Raw((attempt,), start - 1, first, (start << _SHIFT) - 1))
    x = start
    while x < stop:
        level = next(lv for lv in reversed(LEVELS) if x % (1 << lv) == 0 and x + (1 << lv) <= stop)
        out.append(Node(attempt, level, x >> level))
        x += 1 << level
    if stop << _SHIFT <= last:
        out.append(Raw((attempt,), stop, stop << _SHIFT, last))
    return out
