"""What ``bench/recorder_throughput.py`` prints for one database: every leg's medians and
run-to-run spread, per point and per recorded value, the CPU parts (``--parts``), and the
verdicts of the judged leg against issue 41's goals (:func:`bench.common.judge`: "cannot
decide" when the spread is wider than the margin to the goal)."""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import judge


def _spread(samples: list[float], digits: int = 1) -> str:
    f = f"{{:.{digits}f}}"
    med = f.format(statistics.median(samples))
    return f"{med} ({f.format(min(samples))}..{f.format(max(samples))})"


def _cpu(r: dict[str, Any]) -> dict[str, float]:
    """CPU per point of one run: the recorder thread, the database (its backends and
    background processes; SQLite's work is the recorder thread's), redis-server."""
    us = r["backlog"]["us_per_point"]
    return {
        "recorder": us["recorder"],
        "database": us["postgres"],
        "background": us.get("postgres_bg", 0.0),
        "redis": us["redis"],
    }


def _trickle(runs: list[dict[str, Any]]) -> str:
    """The trickle leg's recorder CPU per point (and its chunk writes', with --parts)."""
    cpu = [r["trickle"]["cpu_us"] for r in runs if "cpu_us" in r["trickle"]]
    if not cpu:
        return ""
    chunks = [r["trickle"]["chunks_us"] for r in runs if r["trickle"].get("chunks_us")]
    more = f", chunk writes {_spread(chunks)} us" if chunks else ""
    return f", recorder CPU {_spread(cpu)} us a point{more}"


def report(
    db: str,
    results: dict[tuple[str, str | None], list[dict[str, Any]]],
    goals: tuple[float, float],
    values: int,
    judged: str | None,
) -> None:
    """Print each leg (``(leg, method) -> runs``), then the verdicts of ``("after",
    judged)`` per recorded value (``values`` per point)."""
    base: float | None = None
    for (leg, method), runs in results.items():
        name = f"{db:10s} {leg:6s} {method or 'default':8s}"
        rate = [r["backlog"]["persist_per_s"] for r in runs]
        cpu = [_cpu(r) for r in runs]
        rec = [c["recorder"] for c in cpu]
        dbs = [c["database"] for c in cpu]
        if leg == "before":
            base = statistics.median(rec) + statistics.median(dbs)
        vs = ""
        if base and leg == "after":
            now = statistics.median(rec) + statistics.median(dbs)
            vs = f"; recorder + database CPU x{now / base:.2f} of before"
        print(
            f"{name} backlog, {len(runs)} runs, median (min..max): persisted "
            f"{_spread(rate, 0)}/s{vs}\n"
            f"{'':27s} CPU per point: recorder {_spread(rec)} us, database {_spread(dbs)} us "
            f"(background processes {_spread([c['background'] for c in cpu])}), redis "
            f"{_spread([c['redis'] for c in cpu])} us\n"
            f"{'':27s} CPU per value: recorder {_spread([x / values for x in rec], 2)} us, "
            f"database {_spread([x / values for x in dbs], 2)} us\n"
            f"{'':27s} live: persisted {_spread([r['live']['persist_per_s'] for r in runs], 0)}"
            f"/s, lag after the last publish {_spread([r['live']['lag_s'] for r in runs], 2)} s;"
            f" one job at 100 steps/s in SQL after "
            f"{_spread([r['trickle']['p50_s'] for r in runs], 2)} s (median point){_trickle(runs)}",
            flush=True,
        )
        parts = [r["backlog"].get("parts") or {} for r in runs]
        if parts[0]:
            shown = ", ".join(
                f"{k} {statistics.median(p.get(k, 0.0) for p in parts):.1f}" for k in parts[0]
            )
            print(f"{'':27s} parts, us per point (median): {shown}", flush=True)
    runs = results.get(("after", judged), [])
    if not runs:
        return
    rec = [_cpu(r)["recorder"] / values for r in runs]
    dbs = [_cpu(r)["database"] / values for r in runs]
    if db == "sqlite":
        # The database is a library here: its CPU is the recorder thread's.
        verdicts = [judge("SQLite recorder (with the database) CPU per value", rec, sum(goals))]
    else:
        verdicts = [
            judge(f"{db} recorder CPU per value", rec, goals[0]),
            judge(f"{db} database CPU per value (background processes included)", dbs, goals[1]),
        ]
    for v in verdicts:
        print(f"{'':27s} {v.line(' us', 2)}", flush=True)


def against_mlflow(medians: dict[str, float], peer: dict[str, Any], values: int) -> None:
    """Print the MLflow peer's ingest beside the recorder's (``medians``: per database,
    the after leg's recorder + database CPU per point, ``values`` a point). MLflow's figure is
    its one process (the tracking store and SQLite in it) logging ``log_batch`` calls of
    1,000 metrics directly, with no HTTP server or stream in front, so it favours the peer."""
    ingest = peer["ingest"]
    per_value = ingest["cpu_s"] * 1e6 / (peer["steps"] * peer["fields"])
    print(
        f"MLflow {peer['mlflow']} ingest (SQLite store, {peer['steps']:,} steps of "
        f"{peer['fields']} metrics, log_batch): {per_value:.2f} us CPU a value",
        flush=True,
    )
    for db, per_point in medians.items():
        ours = per_point / values
        print(
            f"  amptrain {db} recorder + database: {ours:.2f} us a value, "
            f"{per_value / ours:.1f}x less CPU than MLflow",
            flush=True,
        )


def after_cpu(runs: list[dict[str, Any]]) -> float:
    """The median recorder + database CPU per point of ``runs``."""
    return statistics.median(_cpu(r)["recorder"] + _cpu(r)["database"] for r in runs)
