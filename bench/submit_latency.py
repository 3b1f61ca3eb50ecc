"""Submit to running, and submit to the first metric a WebSocket watcher sees: every attempt
in a fresh training process (warm spare off) against a warm spare (``AMPTRAIN_WARM_SPARE``,
the default), side by side in one run; and cold starts.

    python bench/submit_latency.py [--jobs 12] [--rounds 3] [--gap 0] [--cold 3] [--quick]
                                   [--database-url URL]

For each mode it starts a real private redis-server, a SQLite database (or
``--database-url``), the API (uvicorn) and one worker (Celery, concurrency 1)
as the test suite's stack does, trains one unmeasured job, then submits
``--jobs`` small CPU jobs (the mlp, 20 steps) back to back: each the moment the previous
one finished (``--gap`` seconds later), so a warm spare has only the previous job's tail to
get ready, as for a user's queue of jobs. A watcher connects to ``WS /jobs/{id}/ws``
right after ``POST /jobs`` returns. Cold starts (``--cold``): a fresh worker each time,
the job submitted the moment the worker is live (``GET /workers``), before any spare is
warm: the first metric of a job on a worker that just started.

The goals (on a 2-core machine: submit->running p50 <= 0.5 s, submit->first metric p50 <=
1.5 s, warm-spare mode, back to back) are judged on the p50 of each of ``--rounds`` rounds
of the jobs: the verdict says "cannot decide" when those medians spread wider than their
margin to the goal (:func:`bench.common.judge`).

Besides the totals it prints where the time went (medians), from the job's
own timestamps (same machine, one clock): API commit (``created_at``), claim
(``started_at``), the ``started`` event (the training process chose its
precision: spawn, imports, model built), the end of step 1 (the metric's
``time``), and its arrival at the watcher.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.cli.embedded_redis import EmbeddedRedis
from bench.common import judge
from tests.support.specs import service_job
from tests.support.stack import Stack, wait_until

STEPS = ("commit", "claim", "started", "step 1", "watcher")
GOALS = {"claim": 0.5, "watcher": 1.5}
"""Seconds from submit to running and to the first metric at a watcher (p50)."""


def spec() -> dict[str, Any]:
    # The default flush policy (every 10 steps or 500 ms), as a user's job has it.
    return service_job(max_steps=20, telemetry={}, checkpoint={})


def has_metric(message: Any) -> bool:
    """Whether a WebSocket message holds a metric point (one message or a batch of them)."""
    if isinstance(message, list):
        return any(has_metric(m) for m in message)
    if isinstance(message, dict):
        if message.get("type") == "metric" or message.get("kind") == "metric":
            return True
        return any(has_metric(v) for v in message.values() if isinstance(v, (list, dict)))
    return False


class Watcher(threading.Thread):
    """Connects to the job's WebSocket at once; notes when the first metric arrives."""

    def __init__(self, stack: Stack, job_id: str) -> None:
        super().__init__(daemon=True)
        self.url = f"ws://127.0.0.1:{stack.port}/jobs/{job_id}/ws"
        self.headers = {"Authorization": f"Bearer {stack.token}"}
        self.first_metric: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._watch())
        except BaseException as exc:  # reported by the caller
            self.error = exc

    async def _watch(self) -> None:
        async with websockets.connect(
            self.url, additional_headers=self.headers, open_timeout=30
        ) as ws:
            async for raw in ws:
                if has_metric(json.loads(raw)):
                    self.first_metric = time.time()
                    return


def stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def one_job(stack: Stack) -> dict[str, float]:
    t0 = time.time()
    r = stack.client.post("/jobs", json=spec())
    assert r.status_code in (200, 201), r.text
    job_id = r.json()["id"]
    watcher = Watcher(stack, job_id)
    watcher.start()
    done = stack.wait_for_status(job_id, "succeeded", "failed", timeout=300)
    assert done["status"] == "succeeded", done
    watcher.join(60)
    if watcher.first_metric is None:
        raise AssertionError(f"the watcher saw no metric: {watcher.error!r}")
    started = next(e for e in stack.events(job_id) if e["type"] == "started")
    first = stack.client.get(f"/jobs/{job_id}/metrics", params={"limit": 1}).json()["items"][0]
    process = started["data"].get("process", {})
    return {
        "commit": stamp(done["created_at"]) - t0,
        "claim": stamp(done["started_at"]) - t0,
        "started": started["time"] - t0,
        "step 1": first["time"] - t0,
        "watcher": watcher.first_metric - t0,
        "warm": float(bool(process.get("warm"))),
    }


def run_mode(warm: bool, jobs: int, gap: float, database_url: str | None) -> list[dict[str, float]]:
    with running_stack(warm, database_url) as stack:
        stack.start_worker("w1", queues="cpu")
        one_job(stack)  # unmeasured: first requests, first connections
        results = []
        for i in range(jobs):
            time.sleep(gap)
            results.append(one_job(stack))
            r = results[-1]
            print(
                f"  {'warm' if warm else 'cold'} job {i + 1:2d}: running {r['claim']:.2f} s, "
                f"first metric {r['watcher']:.2f} s",
                flush=True,
            )
        return results


def cold_starts(count: int, database_url: str | None) -> list[dict[str, float]]:
    """Each job on a worker that just went live, warm spare on but not yet warm."""
    results = []
    with running_stack(True, database_url) as stack:
        for i in range(count):
            name = f"cold{i}"
            stack.start_worker(name, "cpu")
            live = f"{name}@test"
            wait_until(lambda: live in live_workers(stack), 120, f"worker {live}")  # noqa: B023
            results.append(one_job(stack))
            print(
                f"  fresh worker {i + 1}: first metric {results[-1]['watcher']:.2f} s", flush=True
            )
            # Stopped and reaped: the next job can only go to the next fresh worker.
            stack.kill(name, signal.SIGTERM)
    return results


def live_workers(stack: Stack) -> set[str]:
    return {w["name"] for w in stack.client.get("/workers").json()["items"]}


@contextlib.contextmanager
def running_stack(warm: bool, database_url: str | None) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="amptrain-submit-") as tmp:
        root = Path(tmp)
        redis_server = EmbeddedRedis(root / "redis", appendonly=False).start()
        stack = Stack(root, database_url or f"sqlite:///{root / 'amptrain.db'}", redis_server)
        stack.env["AMPTRAIN_WARM_SPARE"] = "1" if warm else "0"
        stack.env["OMP_NUM_THREADS"] = "1"
        try:
            stack.start_api()
            yield stack
        finally:
            stack.close()
            redis_server.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(results: dict[str, list[dict[str, float]]]) -> None:
    print("\nsubmit -> ...            " + "".join(f"{m:>22}" for m in results))
    for key, label in (("claim", "running"), ("watcher", "first metric (WS)")):
        cells = "".join(
            f"{f'p50 {pct([r[key] for r in rs], 0.5):.2f} p95 {pct([r[key] for r in rs], 0.95):.2f}':>22}"
            for rs in results.values()
        )
        print(f"{label:<25}{cells}")
    print("\nwhere the time went (median seconds since the previous mark):")
    for i, key in enumerate(STEPS):
        prev = STEPS[i - 1] if i else None
        cells = "".join(
            f"{statistics.median(r[key] - (r[prev] if prev else 0.0) for r in rs):>22.3f}"
            for rs in results.values()
        )
        print(f"  {('POST -> ' if not prev else prev + ' -> ') + key:<23}{cells}")
    warm = results.get("warm spare on", [])
    if warm:
        print(f"\njobs the warm spare took: {sum(r['warm'] for r in warm):.0f} of {len(warm)}")


def verdicts(jobs: list[dict[str, float]], rounds: int, label: str) -> None:
    """Each goal judged on the p50 of each round of ``jobs`` (in submission order)."""
    size = max(1, len(jobs) // rounds)
    parts = [jobs[i : i + size] for i in range(0, size * rounds, size) if jobs[i : i + size]]
    for key, goal in GOALS.items():
        medians = [statistics.median(r[key] for r in part) for part in parts]
        print(
            judge(f"{label} submit->{key} p50 of {len(parts)} rounds", medians, goal).line(" s", 2)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3, help="the jobs' rounds the goals judge")
    parser.add_argument("--gap", type=float, default=0.0, help="idle seconds before each job")
    parser.add_argument("--cold", type=int, default=3, help="jobs each on a fresh worker")
    parser.add_argument("--quick", action="store_true", help="6 jobs, 2 cold starts")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--only", choices=("off", "on"), default=None)
    args = parser.parse_args()
    jobs, cold = (6, 2) if args.quick else (args.jobs, args.cold)
    modes = [m for m in ("off", "on") if args.only in (None, m)]
    results = {}
    for mode in modes:
        print(f"warm spare {mode}: {jobs} jobs back to back (gap {args.gap} s)", flush=True)
        results[f"warm spare {mode}"] = run_mode(mode == "on", jobs, args.gap, args.database_url)
    if cold:
        print(f"cold starts: {cold} jobs, each on a fresh worker", flush=True)
        results["fresh worker"] = cold_starts(cold, args.database_url)
    report(results)
    print()
    for label, jobs_of in results.items():
        if label != "fresh worker":
            verdicts(jobs_of, args.rounds, label)
    if cold:
        fresh = [r["watcher"] for r in results["fresh worker"]]
        print(
            f"fresh worker, submit->first metric: median {statistics.median(fresh):.2f} s "
            f"(min..max {min(fresh):.2f}..{max(fresh):.2f}; no goal: the price of a cold start)"
        )


if __name__ == "__main__":
    main()
