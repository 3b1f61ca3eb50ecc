"""What ``deterministic: true`` costs: the same jobs with the option off and on, side by side.

Workloads, through the engine's own Trainer, in bf16 (fp16 below compute capability 8.0):

- ``cnn``: the built-in CNN on synthetic images, where the option turns cuDNN's autotuning
  off and restricts convolutions to its deterministic algorithms;
- ``transformer``: the built-in transformer (attention dropout 0.1) on synthetic text, where
  it makes flash / memory-efficient attention's backward deterministic and fixes cuBLAS's
  workspace.

Each mode trains both workloads in a fresh process of its own, as the worker runs an
attempt: ``on`` with ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in its environment (the worker's
training process sets it; cuBLAS reads it once, at its first call), ``off`` without it. Two
processes, not four: each costs an ``import torch`` and a CUDA context, seconds of a
device check's few minutes. Timing: ``--steps`` optimizer steps after ``--warmup`` (autotuning,
lazy optimizer state and the allocator settle there), between two device synchronisations,
telemetry flushed only outside them. It prints one ``deterministic WORKLOAD`` line per
workload (off and on ms/step, and on/off) and has no goal: the cost is what it is, for the
README to quote once a GPU has measured it.

On a CPU (``--device cpu``: deploy/gpu-check.sh's dry run) the same path checks itself with
small sizes in fp32, on one thread; the figures then say nothing about a GPU.

    python bench/determinism_cost.py --json out.json            # CUDA
    python bench/determinism_cost.py --device cpu --steps 3 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's amptrain, also in the fresh processes
WORKLOADS = ("cnn", "transformer")
CUBLAS = ":4096:8"


def job(workload: str, device: str, deterministic: bool, small: bool) -> dict[str, Any]:
    """The spec of one timed run (``small``: CPU sizes)."""
    if workload == "cnn":
        side = 16 if small else 64
        parts: dict[str, Any] = {
            "model": {"name": "cnn", "args": {"width": 8 if small else 64, "depth": 3}},
            "dataset": {"name": "synthetic-images", "args": {"height": side, "width": side}},
            "batch_size": 8 if small else 128,
        }
    else:
        d_model, seq_len = (32, 16) if small else (512, 256)
        parts = {
            "model": {
                "name": "transformer",
                "args": {"d_model": d_model, "n_layers": 4, "n_heads": 8, "dropout": 0.1},
            },
            "dataset": {
                "name": "synthetic-text",
                "args": {"seq_len": seq_len, "vocab_size": 512, "num_samples": 1024},
            },
            "batch_size": 8 if small else 32,
        }
    return {
        **parts,
        "device": device,
        "max_steps": 100_000,
        "deterministic": deterministic,
        "eval": {"enabled": False},
        "telemetry": {"flush_every_steps": 100_000, "flush_every_ms": 3_600_000},
        "checkpoint": {"every_steps": 100_000},
    }


def time_one(spec: dict[str, Any], precision: str, steps: int, warmup: int) -> float:
    """Milliseconds per optimizer step of ``spec`` after the warm-up."""
    import torch

    from amptrain.contract.spec import parse_spec
    from amptrain.engine import RunContext, Trainer

    if spec["device"] == "cpu":
        # One thread: on a shared machine, torch's thread per core spin-waits for cores other
        # processes hold, and a step of 10 ms took 1 s now and then (measured here, 2 cores).
        torch.set_num_threads(1)
    trainer = Trainer(parse_spec({**spec, "precision": precision}), RunContext(None))
    device = trainer.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        for _ in range(warmup):
            trainer.train_step()
        trainer.telemetry.flush()
        sync()
        started = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        sync()
        took = time.perf_counter() - started
    finally:
        trainer.feeder.close()
        trainer.telemetry.close(5.0)  # the process ends here: its switches end with it
    return took / steps * 1e3


def in_fresh_process(args: argparse.Namespace, on: bool) -> dict[str, float]:
    """Milliseconds per step of every workload, trained in one fresh process in one mode."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    if on:
        env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS
    command = [sys.executable, __file__, "--mode", "on" if on else "off"]
    command += ["--device", args.device, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"{'on' if on else 'off'} failed:\n{done.stderr[-3000:]}")
    ms: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return ms


def precision_for(device: str) -> str:
    import torch

    if device != "cuda":
        return "fp32"  # a CPU's bf16 is usually emulated: fp32 times what the option changes
    return "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp16"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--mode", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    small = args.device == "cpu"
    precision = precision_for(args.device)
    if args.mode:  # a child: every workload in this mode, the figures as the last line
        on = args.mode == "on"
        times = {
            w: time_one(job(w, args.device, on, small), precision, args.steps, args.warmup)
            for w in WORKLOADS
        }
        print(json.dumps(times))
        return
    print(f"{args.device}, {precision}, {args.steps} steps after {args.warmup}", flush=True)
    off, on = in_fresh_process(args, on=False), in_fresh_process(args, on=True)
    rows = []
    for workload in WORKLOADS:
        rows.append({"workload": workload, "off_ms": off[workload], "on_ms": on[workload]})
        print(
            f"deterministic {workload}: off {off[workload]:.2f} ms/step, on {on[workload]:.2f} "
            f"({on[workload] / off[workload]:.2f}x)",
            flush=True,
        )
    if args.json:
        result = {"device": args.device, "precision": precision, "steps": args.steps}
        args.json.write_text(json.dumps({**result, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
