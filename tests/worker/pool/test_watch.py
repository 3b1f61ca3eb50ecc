"""The attempt's lease, against real (here: unreachable) services."""

from __future__ import annotations

from pathlib import Path

from amptrain.core.enums import JobStatus
from amptrain.core.settings import Settings
from amptrain.store.db import make_engine, make_session_factory
from amptrain.worker.pool.watch import Lease
from tests.support.stack import wait_until


def test_a_worker_that_cannot_renew_for_a_whole_lease_fences_itself(tmp_path: Path) -> None:
    # A database nobody listens on: every renewal fails with a real connection error.
    settings = Settings(
        data_dir=tmp_path,
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2",
        lease_seconds=0.5,
    )
    engine = make_engine(settings.database_url)
    lease = Lease(make_session_factory(engine), "j_x", 1, settings.lease_seconds)
    # A blip shorter than the lease: keep training, the reconciler has not moved the job.
    assert lease.renew() == JobStatus.RUNNING
    # Past the lease a successor may own the job: report the lease as lost.
    wait_until(lambda: lease.renew() is None, 10, "self-fencing")
    engine.dispose()
