"""A downsampled read of per-layer norms is bounded in norms, not only in steps: a hostile
``max_points`` on a job of many layers keeps at most ``LAYER_NORMS_READ_VALUES`` norms
and says by how much it reduced the steps. The norms are written to the database as the
recorder writes them (into their chunks and roll-ups), on each database."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.layers import LAYER_NORMS_MAX, LAYER_NORMS_READ_VALUES
from amptrain.contract.metrics import LAYER_NORM_KIND
from amptrain.store.db import make_engine
from amptrain.store.history import rollups
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow  # 107,520 values to write: one database a run

STEPS = 420  # 420 x 256 layers: more norms than one read returns


def write_norms(database_url: str, job_id: str) -> None:
    rows: list[dict[str, Any]] = [
        {
            "job_id": job_id,
            "attempt": 1,
            "step": step,
            "kind": LAYER_NORM_KIND,
            "name": f"blocks.{layer}",
            "value": 1.0 + layer / step,
            "time": 1000.0 + step,
            "stream_ms": 1000 + step,
            "stream_seq": 0,
        }
        for step in range(1, STEPS + 1)
        for layer in range(LAYER_NORMS_MAX)
    ]
    engine = make_engine(database_url)
    with engine.begin() as c:
        rollups.record(Session(bind=c), [], rows)  # as the recorder does
        if engine.dialect.name == "postgresql":
            # What autovacuum does after a bulk load; without statistics the planner guesses.
            c.execute(sa.text("ANALYZE metric_chunks"))
            c.execute(sa.text("ANALYZE metric_rollups"))
    engine.dispose()


def test_a_hostile_max_points_is_reduced_to_the_norms_bound(
    api_stack: Stack, database_url: str
) -> None:
    c = api_stack.client
    job_id = c.post("/jobs", json=cpu_job()).json()["id"]
    write_norms(database_url, job_id)
    kept = LAYER_NORMS_READ_VALUES // LAYER_NORMS_MAX
    response = c.get(f"/jobs/{job_id}/layer-norms", params={"max_points": 10_000})
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["max_points"] == kept < STEPS
    assert page["notice"] == (
        f"max_points reduced from 10000 to {kept}: 256 layers x max_points may be at most "
        f"{LAYER_NORMS_READ_VALUES} norms per read"
    )
    assert 0 < len(page["items"]) <= kept
    assert sum(len(i["values"]) for i in page["items"]) <= LAYER_NORMS_READ_VALUES
    assert all(i["downsampled"] for i in page["items"])
    assert page["items"][-1]["step"] == STEPS
    # Within the bound, the read is as asked, and says nothing more.
    small = c.get(f"/jobs/{job_id}/layer-norms", params={"max_points": 100}).json()
    assert small["max_points"] == 100 and "notice" not in small
    assert len(small["items"]) <= 100
    # Pages by the cursor are bounded as before (at most 100 steps).
    assert len(c.get(f"/jobs/{job_id}/layer-norms").json()["items"]) == 100
