"""What the engine's telemetry costs: a bare PyTorch AMP loop vs the engine streaming every
step's record to a real Redis.

Both sides train the same model on the same data with the same optimizer, schedule,
precision, clipping and step count. The arms are interleaved ABAB: every engine run
follows a bare run of its own (bare, engine, bare, in-process, bare, no sink, ...), and each
ratio is an engine run over the bare run just before it, so drifting machine load hits
both halves of a pair alike (on a shared machine the bare runs alone varied 6.36-8.68 s
within one run). The engine side uses the training child's sink as shipped
(amptrain.worker.child.sink_process.ProcessSink: Redis I/O in a sink process of its own)
against a private redis-server (amptrain.cli.embedded_redis.EmbeddedRedis) and checks that
every step's record arrived.

The figure judged is CPU time of the process tree doing the work: this process (all its
threads, the publisher's included), the sink process (its CPU from the clock's start to its
exit: its start-up, once per job, stays out) and the redis-server; wall time and this
process's CPU alone are printed beside it. Every ratio is judged by
:func:`bench.common.judge` over the pairs: median, min..max, and "cannot decide" when the
spread exceeds the margin to the goal, or when the median is below 1 (an engine run cannot
cost less than the bare loop: such a ratio is noise, not a negative overhead).

Also runs the engine with the in-process RedisSink on its publisher thread (the path
before the sink process, for comparison), the engine without a sink, to tell the engine's
own cost from the sink's, the engine with the loss-spike check on (``health.spike``,
:data:`SPIKE_RULE`), and the engine recording per-layer gradient norms every
:data:`LAYER_NORMS_EVERY` steps.

CPU (default): an MLP on synthetic vectors, steps of a few milliseconds; goal <= 1.03.
CUDA (``--device cuda``): a CNN on 3x64x64 synthetic images that both sides build on the
GPU (the engine's own data path for that dataset), channels_last, cuDNN autotuning and
the job's TF32 setting on both sides; steps of roughly ten milliseconds; goal <= 1.01
(judged on wall time there: the GPU's work is in no process's CPU time).

    python bench/telemetry_overhead.py [--steps 400] [--pairs 4] [--precision fp32]
    python bench/telemetry_overhead.py --device cuda --precision bf16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.components import registry
from amptrain.components.optim import lr_factor
from amptrain.components.synthetic_images import SyntheticImages
from amptrain.contract.spec import JobSpec, SpikeSpec, parse_spec
from amptrain.core.redis import Keys
from amptrain.engine import RunContext, Trainer
from amptrain.engine.precision import AUTOCAST_DTYPES, apply_math_mode, choose_precision
from amptrain.worker.child.sink import RedisSink
from amptrain.worker.child.sink_process import ProcessSink
from bench.common import Verdict, judge, tree_cpu

Timing = tuple[float, float, float]
"""Wall seconds, CPU seconds of this process (all its threads), CPU seconds of the whole tree
doing the work (this process, the sink process, the redis-server)."""
GOALS = {"cpu": 1.03, "cuda": 1.01}
VARIANTS = {
    "engine": "engine+redis (sink process)",
    "in_process": "engine+redis (in-process sink, before)",
    "no_sink": "engine, no sink",
    "spike": "engine+redis, health.spike on (grad_norm, skip)",
    "layer_norms": "engine+redis, telemetry.layer_grad_norms_every 10",
}
"""The engine runs held against the bare loop, by name, with how the summary labels them."""
SPIKE_RULE = SpikeSpec(metric="grad_norm", action="skip", window=100, warmup_steps=20)
"""The ``spike`` variant's rule: the costlier metric (the norm), the action that acts."""
LAYER_NORMS_EVERY = 10
"""The ``layer_norms`` variant: per-layer gradient norms every this many steps."""


def _clock(device: torch.device) -> tuple[float, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float], device: torch.device) -> tuple[float, float]:
    wall, cpu = _clock(device)
    return wall - start[0], cpu - start[1]


def make_spec(args: argparse.Namespace) -> JobSpec:
    if args.device == "cuda":
        model: dict[str, Any] = {"name": "cnn", "args": {"width": args.width, "depth": 4}}
        data: dict[str, Any] = {
            "name": "synthetic-images",
            "args": {"height": 64, "width": 64, "classes": 100},
        }
    else:
        model = {"name": "mlp", "args": {"width": args.width, "depth": 2}}
        data = {"name": "synthetic-classification", "args": {"features": 64, "classes": 10}}
    return parse_spec(
        {
            "name": "telemetry-overhead",
            "model": model,
            "dataset": data,
            "max_steps": args.steps,
            "batch_size": args.batch,
            "precision": args.precision,
            "device": args.device,
            "telemetry": {"flush_every_steps": 10, "flush_every_ms": 500},
            # Telemetry's cost alone: the bare loop it is held against evaluates nothing.
            "eval": {"enabled": False},
        }
    )


def bare_loop(spec: JobSpec) -> tuple[float, float]:
    """The AMP loop a careful user writes by hand (PyTorch AMP docs order), no telemetry."""
    device = torch.device(spec.device)
    apply_math_mode(choose_precision(spec.precision, device), device)
    torch.manual_seed(spec.seed)
    dataset = registry.build_dataset(spec.dataset, seed=spec.seed)
    model = registry.build_model(spec.model, dataset.info).to(device)
    conv = device.type == "cuda" and len(dataset.info.input_shape) == 3
    if conv:
        model = model.to(memory_format=torch.channels_last)
    loss_fn = registry.loss_for(dataset.info)
    optimizer = registry.build_optimizer(spec.optimizer, model.parameters(), device)
    schedule = LambdaLR(optimizer, lr_factor(spec.schedule, spec.max_steps))
    dtype = AUTOCAST_DTYPES[spec.precision]
    scaler = torch.amp.GradScaler(device.type, enabled=spec.precision == "fp16")
    params = list(model.parameters())
    start = _clock(device)
    for step in range(spec.max_steps):
        optimizer.zero_grad(set_to_none=True)
        if conv:  # built on the GPU, as the engine's data path does for this dataset
            assert isinstance(dataset, SyntheticImages)  # the CUDA spec's dataset
            x, y = dataset.batch_on(step * spec.batch_size, spec.batch_size, device)
            x = x.contiguous(memory_format=torch.channels_last)
        else:
            x, y = dataset.batch(step * spec.batch_size, spec.batch_size)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
            loss = loss_fn(logits.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, spec.grad_clip_norm or float("inf"))
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
    return _since(start, device)


class EngineTrainer(Trainer):
    """The engine as shipped; ``--prefetch-depth 0`` builds each batch in the training thread,
    as the bare loop does, to tell the telemetry's cost from the data path's gain."""


SINK_CPU: list[float] = []  # CPU seconds of each run's sink process, start-up excluded


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def engine_run(spec: JobSpec, redis_url: str, *, in_process: bool = False) -> tuple[float, float]:
    """The engine streaming to Redis through the sink process (as shipped), or with
    ``in_process`` through a RedisSink on the publisher thread (the path before it)."""
    device = torch.device(spec.device)
    job_id = f"j_{uuid.uuid4().hex}"  # the shape amptrain.core.redis.Keys accepts
    children_cpu = _children_cpu()
    sink: RedisSink | ProcessSink
    if in_process:
        sink = RedisSink.from_url(redis_url, job_id, attempt=1)
    else:
        sink = ProcessSink(redis_url, job_id, attempt=1)
        # Its start (~0.15 s CPU, once per job) is not a per-step cost: keep it off the clock.
        if not sink.wait_ready(60):
            raise SystemExit("the sink process did not start")
    trainer = EngineTrainer(spec, RunContext(checkpoint_dir=None, sink=sink))
    # The sink's CPU so far is its start-up: what it spends from here on is the run's.
    started_cpu = tree_cpu(sink.pid) if isinstance(sink, ProcessSink) else 0.0
    start = _clock(device)
    result = trainer.train()  # includes draining the last batch into Redis
    elapsed = _since(start, device)
    sink.close()
    if not in_process:
        SINK_CPU.append(_children_cpu() - children_cpu - started_cpu)
    check = RedisSink.from_url(redis_url, job_id, attempt=1).client
    entries = check.xlen(Keys.telemetry(job_id))
    check.close()
    # Every metric record + the "precision" and "data" events + any layer_grad_norm records.
    every = spec.telemetry.layer_grad_norms_every
    expected = spec.max_steps + 2 + (spec.max_steps // every if every else 0)
    if entries != expected or result.dropped_records:
        raise SystemExit(f"telemetry incomplete: {entries} stream entries, expected {expected}")
    return elapsed


def sink_start_cpu(redis_url: str) -> float:
    """CPU seconds a sink process costs to start and stop with nothing to send."""
    before = _children_cpu()
    sink = ProcessSink(redis_url, f"j_{uuid.uuid4().hex}", attempt=1)
    sink.wait_ready(60)
    sink.close()
    return _children_cpu() - before


def engine_no_sink(spec: JobSpec) -> tuple[float, float]:
    """The engine with records built and health checked but sent nowhere (attribution)."""
    device = torch.device(spec.device)
    trainer = EngineTrainer(spec, RunContext(checkpoint_dir=None))
    start = _clock(device)
    trainer.train()
    return _since(start, device)


def summarise(times: dict[str, list[Timing]], goal: float, judged: str) -> dict[str, Any]:
    """Each variant's ratios to the bare run before it, judged per measure (``wall``,
    ``cpu``: this process, ``tree``: every process of the work); ``judged`` is the one the
    goal is held to."""
    out: dict[str, Any] = {}
    for kind, i in (("wall", 0), ("cpu", 1), ("tree", 2)):
        for name in VARIANTS:
            ratios = [e[i] / b[i] for e, b in zip(times[name], times[f"bare:{name}"], strict=True)]
            out[f"{kind}_{name}"] = judge(f"{kind} {VARIANTS[name]}/bare", ratios, goal, floor=1.0)
    out["goal"] = goal
    out["verdict"] = out[f"{judged}_engine"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None, help="default 128 CPU, 512 CUDA")
    parser.add_argument("--width", type=int, default=None, help="default 512 CPU, 64 CUDA")
    parser.add_argument("--precision", default=None, choices=["fp32", "tf32", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument(
        "--prefetch-depth",
        type=int,
        default=None,
        help="the engine's data prefetch (default: the engine's, 2 on CUDA and 0 on a CPU)",
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.batch = args.batch or (512 if cuda else 128)
    args.width = args.width or (64 if cuda else 512)
    args.precision = args.precision or ("bf16" if cuda else "fp32")
    if not cuda:
        torch.set_num_threads(args.threads)
    EngineTrainer.prefetch_depth = args.prefetch_depth
    spec = make_spec(args)

    server = EmbeddedRedis(
        Path(tempfile.mkdtemp(prefix="amp-bench-", dir="/tmp")), appendonly=False
    ).start()
    try:
        bare_loop(spec.model_copy(update={"max_steps": 20}))  # warm-up both paths
        engine_run(spec.model_copy(update={"max_steps": 20}), server.url)
        spiky = spec.model_copy(
            update={"health": spec.health.model_copy(update={"spike": SPIKE_RULE})}
        )
        layered = spec.model_copy(
            update={
                "telemetry": spec.telemetry.model_copy(
                    update={"layer_grad_norms_every": LAYER_NORMS_EVERY}
                )
            }
        )
        runs: dict[str, Any] = {
            "bare": lambda: bare_loop(spec),
            "engine": lambda: engine_run(spec, server.url),
            "in_process": lambda: engine_run(spec, server.url, in_process=True),
            "no_sink": lambda: engine_no_sink(spec),
            "spike": lambda: engine_run(spiky, server.url),
            "layer_norms": lambda: engine_run(layered, server.url),
        }
        times: dict[str, list[Timing]] = {}
        start_cpu = sink_start_cpu(server.url)
        SINK_CPU.clear()
        load = os.getloadavg()
        assert server.process is not None
        for _ in range(args.pairs):
            for name in VARIANTS:  # ABAB: each variant right after a bare run of its own
                for arm in ("bare", name):
                    redis_before = tree_cpu(server.process.pid)
                    sink_runs = len(SINK_CPU)
                    wall, cpu = runs[arm]()
                    sink = sum(SINK_CPU[sink_runs:])
                    tree = cpu + sink + tree_cpu(server.process.pid) - redis_before
                    key = arm if arm == name else f"bare:{name}"
                    times.setdefault(key, []).append((wall, cpu, tree))
    finally:
        server.stop()

    goal = GOALS[args.device]
    bare = [t for name in VARIANTS for t in times[f"bare:{name}"]]
    step_ms = statistics.median(t[0] for t in bare) / args.steps * 1000
    where = torch.cuda.get_device_name() if cuda else f"CPU, {args.threads} thread(s)"
    prefetch = "engine default" if args.prefetch_depth is None else args.prefetch_depth
    print(
        f"telemetry_overhead: {where}; precision={args.precision} steps={args.steps} "
        f"batch={args.batch} width={args.width} prefetch={prefetch} pairs={args.pairs} "
        f"bare step={step_ms:.2f} ms; load average {load[0]:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    print(f"{'bare':>11} wall s: " + " ".join(f"{t[0]:.3f}" for t in bare))
    print(f"{'bare':>11} tree CPU s: " + " ".join(f"{t[2]:.3f}" for t in bare))
    for name in VARIANTS:
        print(f"{name:>11} tree CPU s: " + " ".join(f"{t[2]:.3f}" for t in times[name]))
    judged = "wall" if cuda else "tree"
    result = summarise(times, goal, judged)
    for kind in ("tree", "cpu", "wall"):
        for name in VARIANTS:
            verdict: Verdict = result[f"{kind}_{name}"]
            print("  " + verdict.line())
    sink_ms = statistics.median(SINK_CPU) * 1000
    print(
        f"sink process CPU (in the tree figures): median {sink_ms:.0f} ms per run after its "
        f"start, ~{sink_ms / (args.steps + 1) * 1000:.0f} us per record; starting it costs "
        f"{start_cpu * 1000:.0f} ms once per job (not in the ratios)"
    )
    print(
        f"goal ({judged} median engine+redis/bare <= {goal}): {result['verdict'].verdict.upper()}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "device": where,
                    "bare_step_ms": step_ms,
                    "prefetch_depth": args.prefetch_depth,
                    "load_average": [load[0], os.getloadavg()[0]],
                    "sink_process_cpu_s": SINK_CPU,
                    "sink_process_start_cpu_s": start_cpu,
                    "times": times,
                    **{k: v.as_dict() if isinstance(v, Verdict) else v for k, v in result.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
