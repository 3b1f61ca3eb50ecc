"""Recorder throughput: how many metric points per second the real recorder moves from
Redis Streams into SQL, what CPU it and the database spend per point and per recorded
value, and how long SQL trails the last publish.

Per database (SQLite in a temp file; PostgreSQL in a throw-away database when ``--pg``
or ``AMPTRAIN_TEST_DATABASE_URL`` names a server) and per insert path, in a process of
its own: a private redis-server, ``--jobs`` jobs created and claimed, and the real
recorder's production loop (``Recorder.run`` in a thread, the garbage collector tuned as
the server processes tune it) against a producer process that publishes ``--points``
points over the jobs in the worker sink's entry format (``--batch`` per job per pipeline,
like engine flushes), as fast as it can:

* backlog: everything published first, then a recorder drains it. persisted/s =
  points / (SQL holds every job's last step - recorder start). The CPU per point and per
  recorded value (a step point's fields that hold one: 11) of the recorder thread, of the
  database (the backends serving the bench's database and the server's background
  processes: WAL writer, checkpointer, background writer, autovacuum; not the bench's own
  polling connection) and of redis-server. ``--parts``: the recorder's CPU per point by
  part (decode, each write, the garbage collector, ...).
* live: the recorder runs while the producer publishes. persisted/s = points / (SQL
  holds every job's last step - first publish); lag = that moment - the last XADD.
* trickle, one job at 100 steps/s: how long each point takes to reach SQL (the linger),
  and the recorder's CPU per point at that pace (a batch holds a few points and rewrites
  the open chunk of every series; ``--parts``: the chunk writes' share).

Every leg runs ``--repeat`` times, the legs interleaved; each figure is printed as its
median and min..max, and the default insert path's CPU per value is judged against issue
41's goals (1 us recorder + 1 us database on PostgreSQL; within 2x of their sum on
SQLite, whose database work runs in the recorder thread): "cannot decide" when the
spread is wider than the margin to the goal.

``before`` is the recorder as it was at ``--before REV`` (default ``HEAD``, so ``after``
measures the uncommitted change; ``amptrain/`` exported from git and imported from a temp
directory by this bench's own run, so REV must have the recorder where this working tree
has it: ``amptrain/server/recorder/``, not the layout before the one package); ``after`` is
the working tree (the chunks and their roll-ups: the recorder's one write path).

The peer (when MLflow's venv exists: :func:`bench.common.mlflow_peer`): ``--peer-steps``
steps of as many metrics as a point has values, logged through MLflow's tracking store
(SQLite) in its own process; its ingest CPU a value is printed beside the after leg's
recorder + database CPU a value.

    python bench/recorder_throughput.py [--quick] [--repeat 3] [--parts] [--points 200000]
        [--jobs 20] [--pg URL] [--before REV] [--untuned-gc] [--peer-steps 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "HEAD"
"""The default ``--before``: the last commit, against the working tree."""
RECORDER = "amptrain/server/recorder/service.py"
"""What bench/recorder_run.py imports from the before tree: a REV without it cannot run."""

sys.path.insert(0, str(ROOT))  # bench.recorder_run
# The before leg runs the recorder of an exported tree: its amptrain/ comes first.
sys.path.insert(0, os.environ.get("BENCH_TREE") or str(ROOT))

from bench.common import mlflow_peer  # noqa: E402
from bench.recorder_producer import values_per_point  # noqa: E402
from bench.recorder_report import after_cpu, against_mlflow, report  # noqa: E402
from bench.recorder_run import one_run  # noqa: E402

# -- the driver ----------------------------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


def _before_tree(rev: str) -> Path:
    """``amptrain/`` at ``rev`` in a temp directory; exits naming the problem when git does
    not know ``rev`` or its tree predates the one-package layout."""
    found = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if found.returncode != 0:
        sys.exit(f"--before {rev}: not a commit in {ROOT}")
    commit = found.stdout.decode().strip()
    if _git("cat-file", "-e", f"{commit}:{RECORDER}").returncode != 0:
        sys.exit(
            f"--before {rev}: commit {commit[:10]} has no {RECORDER}: it predates the move into"
            " one amptrain/ package, whose modules this bench's recorder_run.py imports."
            " Pick a commit from the move on (e.g. --before HEAD); for an older recorder, run"
            " --legs after in a checkout of that commit and here, on the same machine."
        )
    tree = Path(tempfile.mkdtemp(prefix="amp-rt-before-", dir="/tmp"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "amptrain"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _spawn(cfg: dict[str, Any], tree: Path | None) -> dict[str, Any] | None:
    env = dict(os.environ)
    env.pop("BENCH_TREE", None)
    if tree is not None:
        env["BENCH_TREE"] = str(tree)
    proc = subprocess.run(
        [sys.executable, __file__, "--run", json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return None
    out = proc.stdout.strip().splitlines()
    if cfg.get("profile"):
        print("\n".join(out[:-1]))
    return dict(json.loads(out[-1]))


def _calibration_ms() -> float:
    """A fixed pure-Python workload (json round trips): on a shared machine every CPU
    number above scales with it, so compare runs by it too."""
    doc = {"step": 1, "loss": 0.25, "lr": 1e-3, "skipped": False, "memory_peak": 123456789}
    start = time.perf_counter()
    for _ in range(50_000):
        json.loads(json.dumps(doc))
    return (time.perf_counter() - start) * 1000


GOAL_US_PER_VALUE = {"postgresql": (1.0, 1.0), "sqlite": (2.0, 2.0)}
"""Issue 41: at most 1 us of recorder CPU and 1 us of database CPU per recorded value on
PostgreSQL, within 2x of that on SQLite (whose database work runs in the recorder thread:
there the two are judged together, against their sum)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100, help="points per job per publish")
    parser.add_argument("--pg", default=os.environ.get("AMPTRAIN_TEST_DATABASE_URL"))
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--legs", default="before,after")
    parser.add_argument("--before", default=BEFORE, help="the commit the before leg runs")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each leg, interleaved")
    parser.add_argument("--quick", action="store_true", help="40,000 points over 10 jobs")
    parser.add_argument("--profile", action="store_true", help="cProfile the recorder thread")
    parser.add_argument("--parts", action="store_true", help="CPU per point of each part")
    parser.add_argument(
        "--untuned-gc",
        action="store_true",
        help="CPython's default garbage collector, not the server processes' tuning",
    )
    parser.add_argument(
        "--peer-steps",
        type=int,
        default=20_000,
        help="steps of the MLflow peer's ingest (0: none; needs its venv: bench/common.py)",
    )
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        import amptrain

        package = Path(os.environ.get("BENCH_TREE") or ROOT) / "amptrain"
        used = Path(amptrain.__file__).resolve().parent
        assert used == package.resolve(), f"this leg imports {used}, not {package}"
        print(json.dumps(one_run(json.loads(args.run))), flush=True)
        return
    if args.quick:
        args.points, args.jobs = 40_000, 10
    dbs = [d for d in args.databases.split(",") if d != "postgresql" or args.pg]
    legs = args.legs.split(",")
    tree = _before_tree(args.before) if "before" in legs else None
    print(
        f"{args.points} points ({values_per_point()} values each) over {args.jobs} jobs, "
        f"{args.batch} per job per publish, {args.repeat} runs of each leg; {os.cpu_count()} "
        f"CPUs; calibration {_calibration_ms():.0f} ms",
        flush=True,
    )
    medians: dict[str, float] = {}
    try:
        for db in dbs:
            runs: list[tuple[str, str | None, Path | None]] = []
            if "before" in legs:
                runs.append(("before", None, tree))
            if "after" in legs:
                runs.append(("after", None, None))
            results: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
            # Interleaved (before, after, before, after, ...): drift of a shared machine
            # reaches every leg alike.
            for _ in range(args.repeat):
                for leg, method, where in runs:
                    cfg = {
                        "db": db,
                        "pg": args.pg,
                        "method": method,
                        "points": args.points,
                        "jobs": args.jobs,
                        "batch": args.batch,
                        "profile": args.profile,
                        "parts": args.parts,
                        "untuned_gc": args.untuned_gc,
                    }
                    r = _spawn(cfg, where)
                    if r is None:
                        print(f"{db} {leg} {method or 'default'} FAILED", flush=True)
                        continue
                    results.setdefault((leg, method), []).append(r)
            report(db, results, GOAL_US_PER_VALUE[db], values_per_point(), None)
            if results.get(("after", None)):
                medians[db] = after_cpu(results[("after", None)])
        peer = mlflow_peer(args.peer_steps, values_per_point()) if args.peer_steps else None
        if peer is not None and medians:
            against_mlflow(medians, peer, values_per_point())
        print(f"calibration at the end {_calibration_ms():.0f} ms", flush=True)
    finally:
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    main()
