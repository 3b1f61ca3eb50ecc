"""What the engine's telemetry costs: a bare PyTorch AMP loop vs the engine streaming every
step's record to a real Redis.

Both sides train the same model on the same data with the same optimizer, schedule,
precision, clipping and step count; runs alternate (bare, engine, engine, bare, ...) so
drifting machine load hits both. The engine side uses the worker's RedisSink against a
private redis-server (api.cli.embedded_redis.EmbeddedRedis) and checks that every step's
record arrived. Prints the time ratio engine / bare (goal: <= 1.03 on CPU with steps of a
few milliseconds), in wall time and in this process's CPU time (all threads, the publisher's
included: less sensitive to other load on a shared machine, blind to redis-server's CPU).
Also runs the engine without a sink, to tell the engine's own cost from the sink's.

    python bench/telemetry_overhead.py [--steps 400] [--pairs 4] [--precision fp32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from api.cli.embedded_redis import EmbeddedRedis
from api.core.redis import Keys
from trainer_core import registry
from trainer_core.contract.spec import JobSpec, parse_spec
from trainer_core.engine import RunContext, Trainer
from trainer_core.engine.precision import AUTOCAST_DTYPES
from worker.child.sink import RedisSink

Timing = tuple[float, float]  # (wall seconds, CPU seconds of this process, all its threads)


def _clock() -> Timing:
    return time.perf_counter(), time.process_time()


def _since(start: Timing) -> Timing:
    wall, cpu = _clock()
    return wall - start[0], cpu - start[1]


def make_spec(args: argparse.Namespace) -> JobSpec:
    return parse_spec(
        {
            "name": "telemetry-overhead",
            "model": {"name": "mlp", "args": {"width": args.width, "depth": 2}},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 64, "classes": 10},
            },
            "max_steps": args.steps,
            "batch_size": args.batch,
            "precision": args.precision,
            "device": "cpu",
            "telemetry": {"flush_every_steps": 10, "flush_every_ms": 500},
        }
    )


def bare_loop(spec: JobSpec) -> Timing:
    """The AMP loop a careful user writes by hand (PyTorch AMP docs order), no telemetry."""
    torch.manual_seed(spec.seed)
    dataset = registry.build_dataset(spec.dataset, seed=spec.seed)
    model = registry.build_model(spec.model, dataset.info)
    loss_fn = registry.loss_for(dataset.info)
    device = torch.device("cpu")
    optimizer = registry.build_optimizer(spec.optimizer, model.parameters(), device)
    schedule = registry.build_schedule(spec.schedule, optimizer, spec.max_steps)
    dtype = AUTOCAST_DTYPES[spec.precision]
    scaler = torch.amp.GradScaler("cpu", enabled=spec.precision == "fp16")
    params = list(model.parameters())
    start = _clock()
    for step in range(spec.max_steps):
        optimizer.zero_grad(set_to_none=True)
        x, y = dataset.batch(step * spec.batch_size, spec.batch_size)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
            loss = loss_fn(logits.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, spec.grad_clip_norm or float("inf"))
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
    return _since(start)


def engine_run(spec: JobSpec, redis_url: str) -> Timing:
    job_id = f"bench-{uuid.uuid4().hex[:8]}"
    sink = RedisSink.from_url(redis_url, job_id, attempt=1)
    trainer = Trainer(spec, RunContext(checkpoint_dir=None, sink=sink))
    start = _clock()
    result = trainer.train()  # includes draining the last batch into Redis
    elapsed = _since(start)
    sink.close()
    check = RedisSink.from_url(redis_url, job_id, attempt=1).client
    entries = check.xlen(Keys.telemetry(job_id))
    check.close()
    expected = spec.max_steps + 1  # every metric record + the "precision" event
    if entries != expected or result.dropped_records:
        raise SystemExit(f"telemetry incomplete: {entries} stream entries, expected {expected}")
    return elapsed


def engine_no_sink(spec: JobSpec) -> Timing:
    """The engine with records built and health checked but sent nowhere (attribution)."""
    trainer = Trainer(spec, RunContext(checkpoint_dir=None))
    start = _clock()
    trainer.train()
    return _since(start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = make_spec(args)

    server = EmbeddedRedis(
        Path(tempfile.mkdtemp(prefix="amp-bench-", dir="/tmp")), appendonly=False
    ).start()
    try:
        bare_loop(spec.model_copy(update={"max_steps": 20}))  # warm-up both paths
        engine_run(spec.model_copy(update={"max_steps": 20}), server.url)
        times: dict[str, list[Timing]] = {"bare": [], "engine": [], "no_sink": []}
        runs: dict[str, Any] = {
            "bare": lambda: bare_loop(spec),
            "engine": lambda: engine_run(spec, server.url),
            "no_sink": lambda: engine_no_sink(spec),
        }
        for i in range(args.pairs):
            order = ["bare", "engine", "no_sink"]
            for name in order if i % 2 == 0 else order[::-1]:
                times[name].append(runs[name]())
    finally:
        server.stop()

    bare_wall = [t[0] for t in times["bare"]]
    step_ms = statistics.median(bare_wall) / args.steps * 1000
    print(
        f"precision={args.precision} steps={args.steps} batch={args.batch} width={args.width} "
        f"threads={args.threads} bare step={step_ms:.2f} ms"
    )
    for name, timings in times.items():
        print(f"{name:>8} wall s: " + " ".join(f"{t[0]:.3f}" for t in timings))
    for kind, i in (("wall", 0), ("process CPU", 1)):
        base = [t[i] for t in times["bare"]]
        for name, label in (("engine", "engine+redis"), ("no_sink", "engine, no sink")):
            values = [t[i] for t in times[name]]
            ratios = [e / b for e, b in zip(values, base, strict=True)]
            print(
                f"{kind:>11} ratio {label}/bare: median {statistics.median(ratios):.3f}, "
                f"best-of-{args.pairs} {min(values) / min(base):.3f} (goal <= 1.03)"
            )


if __name__ == "__main__":
    main()
