"""The supervisor's own rules, against real (here: unreachable) services."""

from __future__ import annotations

import time
from pathlib import Path

from api.cli.embedded_redis import EmbeddedRedis
from api.core.settings import Settings
from tests.support.stack import wait_until
from worker.pool.slot import PoolSlot
from worker.pool.supervisor import Supervisor


def test_a_worker_that_cannot_renew_for_a_whole_lease_fences_itself(
    session_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    # A database nobody listens on: every renewal fails with a real connection error.
    settings = Settings(
        data_dir=tmp_path,
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2",
        redis_url=session_redis.url,
        lease_seconds=0.5,
    )
    supervisor = Supervisor(settings, "w@test", PoolSlot())
    supervisor._renewed_at = time.monotonic()
    # A blip shorter than the lease: keep training, the reconciler has not moved the job.
    assert supervisor._heartbeat("j_x", 1) == "running"
    # Past the lease a successor may own the job: report the lease as lost.
    wait_until(lambda: supervisor._heartbeat("j_x", 1) is None, 10, "self-fencing")
