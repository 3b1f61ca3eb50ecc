"""The compatibility window of the packed metric entry (:mod:`amptrain.contract.stream_pack`):
a stream an older worker wrote (flat entries), one a new worker wrote (packed) and one that
mixes them entry by entry (a job whose workers were upgraded mid-run) record the same
bytes -- every chunk, roll-up and exemplar row, the job's step and summary, so every SQL
read -- and the live hub gives their watchers the same messages. The batches are
test_route_parity's odd cases (nulls, NaN and infinities, gaps, re-sent and out-of-order
steps, a value that is not plain, evaluations, an attempt change). Real Redis, real SQLite
and PostgreSQL."""

from __future__ import annotations

import asyncio

import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.cursor import ORIGIN
from amptrain.contract.stream import encode
from amptrain.core.redis import Keys
from amptrain.server.live.hub import LiveHub
from amptrain.server.live.messages import record_out
from amptrain.server.recorder.service import Recorder
from tests.server.recorder.test_recorder import Sessions, start_job
from tests.server.recorder.test_route_parity import BATCHES, TABLES, _items, _route, _stored

FORMS = ("flat", "packed", "mixed")


def _publish(r: redis.Redis, jobs: dict[str, str], k: int, seq: int) -> int:
    """Batch ``k`` into every form's stream under the same entry ids; the last id's seq."""
    for attempt, item in _items(BATCHES[k]):
        seq += 1
        for form, job_id in jobs.items():
            packed = form == "packed" or (form == "mixed" and seq % 2 == 0)
            fields = encode(item, job_id=job_id, attempt=attempt, packed=packed)
            r.xadd(Keys.telemetry(job_id), fields, id=f"1700000000000-{seq}")  # type: ignore[arg-type]
    return seq


async def _live(url: str, job_id: str) -> list[str]:
    """The live messages' text a watcher resuming from the origin gets."""
    hub = LiveHub(url)
    try:
        entries = await hub.read_range(job_id, ORIGIN, count=10_000)
    finally:
        await hub.close()
    return [record_out(e.item["kind"], str(e.pos), e.item).text for e in entries]


def test_old_new_and_mixed_streams_record_and_stream_the_same(
    sf: Sessions, r: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    jobs = {form: start_job(sf)[0] for form in FORMS}
    rec = Recorder(None, sf, r)
    seq = 0
    for k in range(len(BATCHES)):
        seq = _publish(r, jobs, k, seq)
        if k == 0:  # the packed and the flat batches as columns, the mixed ones per entry
            routes = {form: _route(r, job_id) for form, job_id in jobs.items()}
            assert routes == {"flat": True, "packed": True, "mixed": False}
        rec.drain_once()
    stored = {form: _stored(sf, job_id) for form, job_id in jobs.items()}
    assert len(stored["flat"]["metric_chunks"]) > 40
    for table in (*TABLES, "jobs"):
        assert stored["packed"][table] == stored["flat"][table], table
        assert stored["mixed"][table] == stored["flat"][table], table
    live = {form: asyncio.run(_live(redis_server.url, job_id)) for form, job_id in jobs.items()}
    assert len(live["flat"]) == seq
    assert live["packed"] == live["flat"]
    assert live["mixed"] == live["flat"]
