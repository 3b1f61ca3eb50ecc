"""What several benchmarks share: the job they submit, a throw-away PostgreSQL database, the
verdict of repeated measurements against a goal (:func:`judge`), CPU time of process trees
and of PostgreSQL, and the MLflow peer (:func:`mlflow_peer`)."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
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


@dataclass(frozen=True)
class Verdict:
    """Repeated measurements of one figure held against a goal: the median, the spread
    (``low``..``high``) and ``verdict``: ``met``, ``not met``, or ``cannot decide`` when the
    spread is wider than the median's margin to the goal (or, with a ``floor``, when the
    median falls below what the figure can physically be: noise, not a result)."""

    name: str
    median: float
    low: float
    high: float
    goal: float
    lower_is_better: bool
    verdict: str
    why: str

    @property
    def spread(self) -> float:
        """``high - low`` relative to the median."""
        return (self.high - self.low) / abs(self.median) if self.median else math.inf

    def line(self, unit: str = "", digits: int = 3) -> str:
        cmp = "<=" if self.lower_is_better else ">="
        f = f"{{:.{digits}f}}{unit}"
        return (
            f"{self.name}: median {f.format(self.median)} (min..max {f.format(self.low)}.."
            f"{f.format(self.high)}, spread {self.spread:.1%}); goal {cmp} {f.format(self.goal)}: "
            f"{self.verdict.upper()}" + (f" ({self.why})" if self.why else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "spread": self.spread}


def judge(
    name: str,
    samples: Sequence[float],
    goal: float,
    *,
    lower_is_better: bool = True,
    floor: float | None = None,
) -> Verdict:
    """The :class:`Verdict` of ``samples`` (at least one; two or more to see a spread)."""
    if not samples:
        raise ValueError(f"{name}: no samples")
    median, low, high = statistics.median(samples), min(samples), max(samples)
    margin = goal - median if lower_is_better else median - goal
    if floor is not None and median < floor:
        verdict, why = "cannot decide", f"the median is below {floor}, which cannot be: noise"
    elif len(samples) < 2:
        verdict, why = "cannot decide", "one sample shows no spread"
    elif high - low > abs(margin):
        verdict = "cannot decide"
        why = f"the spread {high - low:.3g} exceeds the margin {abs(margin):.3g} to the goal"
    else:
        verdict, why = ("met" if margin >= 0 else "not met"), ""
    return Verdict(name, median, low, high, goal, lower_is_better, verdict, why)


MLFLOW_PYTHON = Path("/work/mlflow-venv/bin/python")
"""Where the MLflow peer's interpreter is looked for (``AMPTRAIN_MLFLOW_PYTHON`` names
another): a venv of its own, never the project's (``python3 -m venv /work/mlflow-venv &&
/work/mlflow-venv/bin/pip install mlflow``)."""


def mlflow_peer(steps: int, fields: int, timeout: float = 3600) -> dict[str, Any] | None:
    """The same run recorded and read through MLflow's tracking store (SQLite) by
    ``bench/mlflow_peer.py`` in MLflow's own venv: ``steps`` steps of ``fields`` metrics
    (CPU and wall seconds of the ingest, a 1,000-point sampled read, one metric's full
    history; see that script). None, with a note printed, when no MLflow venv is there."""
    python = Path(os.environ.get("AMPTRAIN_MLFLOW_PYTHON") or MLFLOW_PYTHON)
    if not python.is_file():
        print(f"mlflow peer: skipped, no {python} (set AMPTRAIN_MLFLOW_PYTHON or create it)")
        return None
    script = Path(__file__).with_name("mlflow_peer.py")
    with tempfile.TemporaryDirectory(prefix="amp-mlflow-") as root:
        done = subprocess.run(
            [str(python), str(script), "--steps", str(steps), "--fields", str(fields), root],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if done.returncode != 0:
        print(f"mlflow peer: failed ({done.returncode}): {done.stderr[-2000:]}")
        return None
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and every live descendant: what a
    bench charges a process that does its work in children (a sink process, a pool)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def postgres_cpu() -> float:
    """CPU seconds of every PostgreSQL process of this machine (the backends and the
    background ones: WAL writer, checkpointer, autovacuum), exited backends included
    through the postmaster's children time. For a bench on a server of its own machine."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.info["name"] not in ("postgres", "postmaster"):
                continue
            t = proc.cpu_times()
            total += t.user + t.system
            parent = proc.parent()
            if parent is None or parent.name() not in ("postgres", "postmaster"):
                total += t.children_user + t.children_system  # the postmaster's reaped backends
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total
