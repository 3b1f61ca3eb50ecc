"""What several benchmarks share: the job they submit and a throw-away PostgreSQL database."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

SPEC: dict[str, Any] = {
    "name": "bench",
    "model": {"name": "mlp", "args": {}},
    "dataset": {"name": "synthetic-classification", "args": {}},
    "device": "cpu",
    "max_steps": 10_000_000,
}
"""A CPU job that never ends by itself: benchmarks claim it and publish its telemetry."""


def throwaway_pg(admin: str) -> tuple[str, Callable[[], None]]:
    """A new, empty PostgreSQL database on the server of ``admin`` (a URL): its URL, and
    what drops it (with any connection still open)."""
    import sqlalchemy as sa

    admin_url = sa.make_url(admin)
    name = f"amptrain_bench_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()

    return admin_url.set(database=name).render_as_string(hide_password=False), drop


def spread_verdict(samples: Sequence[float], goal: float, *, lower_is_better: bool = True) -> str:
    """A goal's verdict from repeated measurements: ``"met"`` or ``"not met"`` when every
    sample falls on one side of ``goal``, else ``"cannot decide"`` (the run-to-run spread
    is wider than the median's margin to the goal), with the median and the spread."""
    ordered = sorted(samples)
    median = ordered[len(ordered) // 2]
    low, high = ordered[0], ordered[-1]
    good = (lambda v: v <= goal) if lower_is_better else (lambda v: v >= goal)
    verdict = (
        "met"
        if good(low) and good(high)
        else "not met"
        if not good(low) and not good(high)
        else "cannot decide"
    )
    return f"{verdict} (median {median:.3g}, spread {low:.3g}..{high:.3g} over {len(ordered)} runs; goal {goal:.3g})"
