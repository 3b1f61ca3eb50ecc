"""Where a resumed attempt may start: only at a checkpoint whose lineage is recorded.

A checkpoint can get ahead of the telemetry SQL holds: an attempt that trained on while
Redis was down, or whose sink process was killed holding undelivered entries (SIGKILL of
the whole worker, ``amptrain up`` killed with everything it started). Resuming from such
a checkpoint would leave the steps between its writer's recorded end and the checkpoint
unrecorded for ever. So every checkpoint names the attempt that wrote it, and the next
attempt starts from the newest one whose writer has recorded through its step; it removes
those after it and re-records every later step (the effective series keeps, per step, the
newest attempt's point).

The check is per attempt, not "the newest step of any attempt": after attempt 3 restarts
below attempt 2's history, attempt 2's points say nothing about attempt 3's checkpoints.
By induction every step of the chosen lineage is recorded: its writer recorded from the
checkpoint it resumed from (itself chosen so) through this one.

Waiting for the recorder first only saves steps trained again; correctness never depends
on it. Keeping undelivered entries on local disk instead would not cover a lost disk or a
worker that never comes back, and SQL, not Redis or a worker's disk, is the truth about a
job.
"""

from __future__ import annotations

import logging
import time

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.cursor import Cursor
from amptrain.core.redis import Keys
from amptrain.store.history.chunk_index import recorded_through

log = logging.getLogger(__name__)

POLL_S = 0.1


def resume_bound(
    sessions: sessionmaker[Session], client: redis.Redis, job_id: str, wait_s: float
) -> dict[int, int]:
    """Per attempt, its newest recorded step, once the recorder has committed what the
    job's stream holds (waiting up to ``wait_s``: an earlier attempt's last entries may be
    in flight); without Redis, what SQL holds now (more steps are trained again, none is
    lost)."""
    if not _wait_recorded(client, job_id, wait_s):
        log.info("job %s: recorder behind the stream; resuming within what SQL holds", job_id)
    with sessions() as s:
        return recorded_through(s, job_id)


def _wait_recorded(client: redis.Redis, job_id: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if _caught_up(client, job_id):
                return True
        except redis.RedisError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def _caught_up(client: redis.Redis, job_id: str) -> bool:
    pipe = client.pipeline(transaction=False)
    pipe.xrevrange(Keys.telemetry(job_id), count=1)
    pipe.get(Keys.recorded(job_id))
    newest, recorded = pipe.execute()
    if not newest:
        return True
    return recorded is not None and Cursor.of_entry(recorded) >= Cursor.of_entry(newest[0][0])
