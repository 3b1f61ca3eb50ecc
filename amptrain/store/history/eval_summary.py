"""A job's newest evaluation (``jobs.eval_summary``), kept by the recorder in its batch's
transaction from the evaluation chunks (it commits; this does not).

The summary is the newest attempt that has evaluated, at its highest step: the model the
job holds now (when the job has finished, its final evaluation), ``{"step", "attempt",
"values": name -> value}`` with the names in name order. It is recomputed from SQL, not
from the batch, so entries arriving out of order or replayed cannot move it back.

Standard library only (the recorder does without numpy), and a few primary-key seeks
whatever the run's length: the attempts and names come from the seeks of
:mod:`~amptrain.store.history.chunk_index`, the highest step from the newest attempt's
highest record chunk.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history import chunk_codec, chunk_index
from amptrain.store.history.chunk_parts import MS, RESERVED, SHIFT
from amptrain.store.models import Job


def refresh(s: Session, job_ids: Iterable[str]) -> None:
    """Set each job's ``eval_summary`` to its newest evaluation (unchanged for a job whose
    chunks hold none)."""
    for job_id in sorted(set(job_ids)):
        summary = newest(s, job_id)
        if summary is None:
            continue
        s.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(eval_summary=summary)
            .execution_options(synchronize_session=False)
        )


def newest(s: Session, job_id: str) -> dict[str, Any] | None:
    """The job's newest evaluation as ``eval_summary`` holds it; None before the first."""
    attempts = chunk_index.attempts(s, job_id, EVAL_KIND)
    if not attempts:
        return None
    attempt = attempts[-1]
    params = {"job": job_id, "kind": EVAL_KIND, "attempt": attempt}
    row = s.execute(_HIGHEST, params).first()
    if row is None:
        return None
    chunk, step = int(row[0]), int(row[1])
    names = [n for n in chunk_index.names(s, job_id, EVAL_KIND) if not n.startswith(RESERVED)]
    values: dict[str, float | None] = {}
    if names:
        found = s.execute(_VALUES, {**params, "chunk": chunk, "names": names}).all()
        for name, data in sorted(found):
            d = chunk_codec.decode(chunk << SHIFT, bytes(data))
            if step not in d.steps:
                continue  # a name this evaluation did not carry
            i = d.steps.index(step)
            values[name] = None if d.nulls and d.nulls[i] else d.values[i]
    return {"step": step, "attempt": attempt, "values": values}


# The record series (one value per evaluation) of the attempt, its highest chunk: an
# attempt's chunks of one name are a range of the primary key.
_HIGHEST = sa.text(
    "SELECT chunk, last_step FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    f"AND name = '{MS}' AND attempt = :attempt ORDER BY chunk DESC LIMIT 1"
)
_VALUES = sa.text(
    "SELECT name, data FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    "AND name IN :names AND chunk = :chunk AND attempt = :attempt"
).bindparams(sa.bindparam("names", expanding=True))
