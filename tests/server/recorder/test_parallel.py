"""A data-parallel run's metric fields (``world_size``, ``memory_peak_per_rank``) go through
the stream and the recorder into SQL and come back from the metric pages, on every insert
path; a one-device run's points have them null."""

from __future__ import annotations

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.contract.stream import decode, encode
from amptrain.core.redis import Keys
from amptrain.server.live.messages import metric_out
from amptrain.server.recorder.service import Recorder
from amptrain.store.history import points as metrics
from tests.server.recorder.test_recorder import point, publish, start_job

Sessions = sessionmaker[Session]


def ddp_point(step: int) -> dict[str, object]:
    peaks = [3000 + step, 3100 + step]
    return point(step, memory_peak=max(peaks), world_size=2, memory_peak_per_rank=peaks)


def test_parallel_fields_round_trip_through_the_recorder(sf: Sessions, r: redis.Redis) -> None:
    ddp, attempt = start_job(sf)
    single, single_attempt = start_job(sf)
    publish(r, ddp, attempt, [ddp_point(s) for s in range(1, 6)])
    publish(r, single, single_attempt, [point(s) for s in range(1, 4)])
    # A malformed value (not from our engine) is stored as null instead of failing the batch.
    bad = encode(ddp_point(6), job_id=ddp, attempt=attempt)
    bad.update(world_size='"two"', memory_peak_per_rank='["a", 1]')
    r.xadd(Keys.telemetry(ddp), bad)  # type: ignore[arg-type]
    publish(r, ddp, attempt, [ddp_point(7)])

    assert Recorder(None, sf, r).drain_once() == 10
    with sf() as s:
        got, _ = metrics.metric_page(s, ddp, metrics.Page(limit=100))
        plain, _ = metrics.metric_page(s, single, metrics.Page(limit=100))
    assert [p["step"] for p in got] == [1, 2, 3, 4, 5, 6, 7]
    for p in got[:5] + got[6:]:
        assert p["world_size"] == 2
        assert p["memory_peak_per_rank"] == [3000 + p["step"], 3100 + p["step"]]
        assert p["memory_peak"] == 3100 + p["step"]  # already the max over ranks
    assert got[5]["world_size"] is None and got[5]["memory_peak_per_rank"] is None
    assert got[5]["loss"] == pytest.approx(1 / 6)  # the rest of that point is kept
    for p in plain:
        assert set(STORED_METRIC_FIELDS) <= set(p)
        assert p["world_size"] is None and p["memory_peak_per_rank"] is None


def test_live_messages_carry_the_parallel_fields() -> None:
    # The live hub decodes stream entries and shares one message per entry between watchers.
    entry = encode(ddp_point(3), job_id="j", attempt=1)
    one = encode(point(3), job_id="j", attempt=1)
    assert "world_size" not in one  # a one-device entry is as small as before
    data = metric_out("1-0", {**decode(entry), "attempt": 1}).text
    assert '"world_size":2' in data and '"memory_peak_per_rank":[3003,3103]' in data
    plain = metric_out("1-1", {**decode(one), "attempt": 1}).text
    assert '"world_size":null' in plain and '"memory_peak_per_rank":null' in plain
