"""Inject each fault N times into a real stack and count what was lost.

    python bench/fault_recovery.py [--rounds 3] [--database-url URL]

For every fault: jobs lost (not succeeded), metric points lost (missing steps in
the effective series), duplicate runs (attempts that trained concurrently, seen
as more than one ``started`` event per attempt or two attempts' points
interleaved), and the time from the fault to the job training again. Prints one
table; uses the test suite's real-process stack (uvicorn, Celery workers, a
private redis-server, SQLite unless --database-url).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.settings import Settings
from amptrain.server.dispatcher import make_celery
from tests.support.specs import mlp_job
from tests.support.stack import Stack, wait_until

STEPS = 200


def spec() -> dict[str, Any]:
    return mlp_job(
        STEPS,
        precision="fp32",
        batch_size=32,
        checkpoint={"every_steps": 25, "keep_last": 2},
        telemetry={"flush_every_steps": 10, "flush_every_ms": 100},
    )


def step_advances(stack: Stack, job_id: str, beyond: int) -> Callable[[], bool]:
    return lambda: stack.job(job_id)["step"] > beyond or stack.job(job_id)["status"] == "succeeded"


# Each fault: inject, then return a predicate that is true once the job trains again.
def kill_9_worker(stack: Stack, job_id: str) -> Callable[[], bool]:
    name = str(stack.job(job_id)["worker"]).split("@")[0]
    stack.kill(name, signal.SIGKILL)
    stack.start_worker(name)  # the machine comes back (the other worker may take the job first)
    return lambda: (
        stack.job(job_id)["attempt"] >= 2
        and stack.job(job_id)["status"] in ("running", "succeeded")
    )


def sigterm_worker(stack: Stack, job_id: str) -> Callable[[], bool]:
    name = str(stack.job(job_id)["worker"]).split("@")[0]
    stack.processes[name].send_signal(signal.SIGTERM)
    stack.processes[name].wait(60)
    stack.start_worker(name)
    return lambda: (
        stack.job(job_id)["attempt"] >= 2
        and stack.job(job_id)["status"] in ("running", "succeeded")
    )


def kill_9_training_child(stack: Stack, job_id: str) -> Callable[[], bool]:
    """What the kernel's OOM killer does: the child dies, its supervisor lives on."""
    name = str(stack.job(job_id)["worker"]).split("@")[0]
    worker = psutil.Process(stack.processes[name].pid)
    for p in worker.children(recursive=True):
        if "amptrain.worker.child.main" in " ".join(p.cmdline()):
            p.kill()
    return lambda: (
        stack.job(job_id)["attempt"] >= 2
        and stack.job(job_id)["status"] in ("running", "succeeded")
    )


def restart_redis(stack: Stack, job_id: str, lose_data: bool = False) -> Callable[[], bool]:
    step = stack.job(job_id)["step"]
    stack.redis_server.kill()
    if lose_data:
        for f in Path(stack.redis_server.directory).glob("appendonly*"):
            f.unlink()
    stack.redis_server.start()
    return step_advances(stack, job_id, step)


def restart_redis_without_data(stack: Stack, job_id: str) -> Callable[[], bool]:
    return restart_redis(stack, job_id, lose_data=True)


def kill_9_api(stack: Stack, job_id: str) -> Callable[[], bool]:
    step = stack.job(job_id)["step"]
    stack.kill("api", signal.SIGKILL)
    stack.start_api()
    return step_advances(stack, job_id, step)


def duplicate_delivery(stack: Stack, job_id: str) -> Callable[[], bool]:
    make_celery(Settings(redis_url=stack.redis_server.url)).send_task(
        "amptrain.run_job", args=[job_id], queue="cpu"
    )
    return lambda: True


FAULTS = [
    kill_9_worker,
    kill_9_training_child,
    sigterm_worker,
    restart_redis,
    restart_redis_without_data,
    kill_9_api,
    duplicate_delivery,
]


def one_round(stack: Stack, fault: Callable[[Stack, str], Callable[[], bool]]) -> dict[str, Any]:
    job = stack.submit(spec())
    wait_until(lambda: stack.job(job["id"])["step"] >= 40, 120, "progress before the fault")
    t0 = time.monotonic()
    back = fault(stack, job["id"])
    wait_until(back, 180, "the job to train again")
    recovery = time.monotonic() - t0
    done = stack.wait_for_status(job["id"], "succeeded", "failed", "cancelled", timeout=300)

    def every_point() -> list[dict[str, Any]] | None:
        points = stack.all_metrics(job["id"])
        return points if len(points) >= STEPS else None

    points = (
        wait_until(every_point, 30, "all points")
        if done["status"] == "succeeded"
        else stack.all_metrics(job["id"])
    )
    steps = {p["step"] for p in points}
    started = [e for e in stack.events(job["id"]) if e["type"] == "started"]
    attempts = [e["attempt"] for e in started]
    return {
        "lost_job": done["status"] != "succeeded",
        "lost_points": STEPS - len(steps & set(range(1, STEPS + 1))),
        "duplicate_runs": len(attempts) - len(set(attempts)),
        "recovery_s": recovery,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--faults", default=",".join(f.__name__ for f in FAULTS))
    args = parser.parse_args()
    chosen = [f for f in FAULTS if f.__name__ in args.faults.split(",")]
    root = Path(tempfile.mkdtemp(prefix="amp-faults-"))
    redis_server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="amp-", dir="/tmp"))).start()
    stack = Stack(root, args.database_url or f"sqlite:///{root / 'amptrain.db'}", redis_server)
    try:
        stack.start_api()
        stack.start_worker("w1")
        stack.start_worker("w2")
        print(
            f"{'fault':28} {'times':>5} {'jobs lost':>9} {'points lost':>11} {'dup runs':>8} {'recover s (median/max)':>24}"
        )
        for fault in chosen:
            rows = [one_round(stack, fault) for _ in range(args.rounds)]
            rec = [r["recovery_s"] for r in rows]
            print(
                f"{fault.__name__:28} {len(rows):5d} {sum(r['lost_job'] for r in rows):9d} "
                f"{sum(r['lost_points'] for r in rows):11d} {sum(r['duplicate_runs'] for r in rows):8d} "
                f"{statistics.median(rec):15.1f} / {max(rec):5.1f}",
                flush=True,
            )
        print(
            f"(lease {stack.env['AMPTRAIN_LEASE_SECONDS']} s, heartbeat {stack.env['AMPTRAIN_HEARTBEAT_SECONDS']} s; "
            "recovery after kill -9 is bounded by the lease)"
        )
    finally:
        stack.close()
        redis_server.stop()


if __name__ == "__main__":
    main()
