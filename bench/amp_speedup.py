"""AMP speed-up on ResNet-50: strict fp32, tf32, fp16 (+ GradScaler) and bf16, as a bare loop
and through the engine's own Trainer, side by side.

Workload (CUDA): ResNet-50 (the catalog's ``resnet50``: torchvision's, untrained)
on 3x224x224 images, batch 256, channels_last, ``cudnn.benchmark``, fused SGD with momentum,
gradient clipping, the AMP step order the engine uses. ``fp32`` is strict IEEE (TF32 off),
``tf32`` is PyTorch's TF32 for matmuls and convolutions: the fair baseline (what users get
from fp32 on Ampere and later), against which the speed-up and memory goals are judged.

- bare: one fixed batch on the GPU, the loop a careful user writes by hand.
- engine: ``Trainer`` with the product's data path (``synthetic-images``, built on the GPU
  a batch at a time), device-side schedule and telemetry flushed every 10 steps to an
  in-process sink. (Host waits are counted by the GPU tests, not here: PyTorch's GPU trace
  hooks call into Python on every allocation, which would slow what is being timed.)

Timing: CUDA events around the steady state after the warm-up; peak memory is reset after
the warm-up (``max_memory_allocated`` over the timed steps). Goals on an H100/H200-class
GPU: fp16 and bf16 >= 2.0x tf32 throughput and >= 45% less peak memory; engine/bare >= 0.97.

On a CPU the same script runs small sizes (ResNet-50 at 64x64, batch 8) to check itself;
CPU memory is the resident-set growth, each run in a fresh process (``--in-process``: all in
this one, as on CUDA, the memory figures then meaningless: deploy/gpu-check.sh's dry run).
``tf32`` runs as fp32 there, and bf16/fp16 speed depends on the CPU (see
``amptrain.engine.cpu_probe``). Besides the goals it prints ``engine/bare`` per precision.

    python bench/amp_speedup.py                         # CUDA when available
    python bench/amp_speedup.py --device cpu --steps 3 --warmup 1 --json out.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
BASELINE = "tf32"
GOALS = {"speedup": 2.0, "memory_saving": 0.45, "engine_vs_bare": 0.97}


@dataclass(frozen=True)
class Setup:
    device: str
    size: int
    batch: int
    classes: int
    steps: int
    warmup: int


class RssPeak:
    """Peak resident-set growth while active, sampled by a thread (CPU memory)."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.proc.memory_info().rss) - self.base


class Clock:
    """Steady-state timing and peak memory. Build it before the warm-up, ``start()`` after it.

    CUDA: CUDA events, and the allocator's peak reset at ``start()``. CPU: wall time, and
    the growth of the resident set from construction (the warm-up's allocations included:
    RSS does not shrink when tensors are freed, so a reset would hide them).
    """

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.device = torch, device
        self.cuda = device.type == "cuda"
        self._rss = None if self.cuda else RssPeak()

    def start(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
            self._begin = self.torch.cuda.Event(enable_timing=True)
            self._begin.record()
        self._t0 = time.perf_counter()

    def stop(self) -> tuple[float, int]:
        """(seconds, peak bytes) since ``start``."""
        if self.cuda:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            seconds = self._begin.elapsed_time(end) / 1e3
            return seconds, int(self.torch.cuda.max_memory_allocated(self.device))
        seconds = time.perf_counter() - self._t0
        assert self._rss is not None
        return seconds, self._rss.stop()


def _spec(setup: Setup, precision: str, max_steps: int) -> Any:
    from amptrain.contract.spec import parse_spec

    return parse_spec(
        {
            "name": f"amp-speedup-{precision}",
            "model": {"name": "resnet50"},
            "dataset": {
                "name": "synthetic-images",
                "args": {"height": setup.size, "width": setup.size, "classes": setup.classes},
            },
            "max_steps": max_steps,
            "batch_size": setup.batch,
            "precision": precision,
            "device": setup.device,
            "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-5},
            "schedule": {"name": "constant"},
        }
    )


def bare(setup: Setup, precision: str) -> dict[str, Any]:
    """The hand-written loop on one fixed device batch."""
    import torch

    from amptrain.components import registry
    from amptrain.components.synthetic_images import SyntheticImages
    from amptrain.engine.precision import apply_math_mode, choose_precision

    spec = _spec(setup, precision, setup.warmup + setup.steps)
    device = torch.device(setup.device)
    choice = choose_precision(precision, device)
    apply_math_mode(choice, device)
    torch.manual_seed(0)
    data = registry.build_dataset(spec.dataset, seed=0)
    assert isinstance(data, SyntheticImages)  # the spec's synthetic-images: it has batch_on
    model = registry.build_model(spec.model, data.info).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    optimizer = registry.build_optimizer(spec.optimizer, model.parameters(), device)
    x, y = data.batch_on(0, setup.batch, device)
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    del data  # its device copy of the patterns is not part of the bare loop's memory
    dtype = choice.autocast_dtype
    scaler = torch.amp.GradScaler(device.type, enabled=choice.uses_scaler)
    params = list(model.parameters())

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()

    clock = Clock(device)
    for _ in range(setup.warmup):
        step()
    clock.start()
    losses = [step() for _ in range(setup.steps)]
    seconds, peak = clock.stop()
    return {
        "effective": choice.effective,
        "samples_per_second": setup.steps * setup.batch / seconds,
        "step_ms": seconds / setup.steps * 1e3,
        "peak_memory_bytes": peak,
        "final_loss": float(torch.stack(losses[-3:]).mean()),
    }


def engine(setup: Setup, precision: str) -> dict[str, Any]:
    """The Trainer with the product's dataset path; timed from step ``warmup`` to the last."""
    import torch

    from amptrain.components import registry
    from amptrain.engine import Components, RunContext, Trainer

    total = setup.warmup + setup.steps
    spec = _spec(setup, precision, total + 1)  # the step after the timed ones is not timed
    device = torch.device(setup.device)
    data = registry.build_dataset(spec.dataset, seed=0)
    torch.manual_seed(0)
    model = registry.build_model(spec.model, data.info)
    parts = Components(model, data, registry.loss_for(data.info))
    clock = Clock(device)
    marks: dict[str, Any] = {}

    def at_step_boundary() -> None:
        if trainer.step == setup.warmup:
            clock.start()
        elif trainer.step == total:
            marks["seconds"], marks["peak"] = clock.stop()

    class Count:
        records = 0

        def write(self, items: list[dict[str, Any]]) -> None:
            Count.records += len(items)

        def close(self) -> None:
            pass

    trainer = Trainer(spec, RunContext(None, sink=Count(), should_stop=at_step_boundary), parts)
    result = trainer.train()
    seconds = marks["seconds"]
    return {
        "effective": result.precision.effective,
        "samples_per_second": setup.steps * setup.batch / seconds,
        "step_ms": seconds / setup.steps * 1e3,
        "peak_memory_bytes": marks["peak"],
        "final_loss": (result.last_record or {}).get("loss"),
        "data_wait_fraction": trainer.feeder.wait_s / max(seconds, 1e-9),
        "on_device_data": trainer.feeder.on_device,
    }


def _isolated(fn: Any, *args: Any) -> dict[str, Any]:
    # A fresh process per CPU run: RSS growth is only meaningful from a clean allocator.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    base = results[BASELINE]["bare"]
    lines = [
        f"{'precision':9} {'bare img/s':>11} {'step ms':>8} {'vs tf32':>8} {'peak mem':>10} "
        f"{'saving':>7} {'engine img/s':>12} {'eng/bare':>8} {'eng peak':>10} {'data wait':>9}"
    ]
    for precision, r in results.items():
        b, e = r["bare"], r["engine"]
        speed = b["samples_per_second"] / base["samples_per_second"]
        saving = 1 - b["peak_memory_bytes"] / base["peak_memory_bytes"]
        label = precision if b["effective"] == precision else f"{precision}>{b['effective']}"
        lines.append(
            f"{label:9} {b['samples_per_second']:11,.1f} {b['step_ms']:8.1f} {speed:7.2f}x "
            f"{_mib(b['peak_memory_bytes']):>10} {saving:7.0%} {e['samples_per_second']:12,.1f} "
            f"{e['samples_per_second'] / b['samples_per_second']:8.3f} "
            f"{_mib(e['peak_memory_bytes']):>10} {e['data_wait_fraction']:9.2%}"
        )
    return "\n".join(lines)


def verdicts(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, bool]:
    base = results[BASELINE]["bare"]
    out = {}
    for precision in ("fp16", "bf16"):
        b = results[precision]["bare"]
        out[f"{precision} >= {GOALS['speedup']}x tf32"] = (
            b["samples_per_second"] >= GOALS["speedup"] * base["samples_per_second"]
        )
        out[f"{precision} peak memory <= {1 - GOALS['memory_saving']:.0%} of tf32"] = (
            b["peak_memory_bytes"] <= (1 - GOALS["memory_saving"]) * base["peak_memory_bytes"]
        )
    for precision, r in results.items():
        ratio = r["engine"]["samples_per_second"] / r["bare"]["samples_per_second"]
        out[f"{precision} engine/bare >= {GOALS['engine_vs_bare']}"] = (
            ratio >= GOALS["engine_vs_bare"]
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (30 CUDA, 3 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (10 CUDA, 1 CPU)")
    parser.add_argument("--batch", type=int, default=None, help="default 256 CUDA, 8 CPU")
    parser.add_argument(
        "--size", type=int, default=None, help="image side, default 224 CUDA, 64 CPU"
    )
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument(
        "--in-process", action="store_true", help="CPU: no fresh process per run (checks only)"
    )
    parser.add_argument("--json", help="also write the results here")
    opts = parser.parse_args()

    import torch

    device = (
        opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    cuda = device == "cuda"
    setup = Setup(
        device=device,
        size=opts.size or (224 if cuda else 64),
        batch=opts.batch or (256 if cuda else 8),
        classes=1000,
        steps=opts.steps or (30 if cuda else 3),
        warmup=opts.warmup or (10 if cuda else 1),
    )
    precisions = [p for p in opts.precisions.split(",") if p]
    if BASELINE not in precisions:
        precisions.insert(0, BASELINE)
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"amp_speedup: ResNet-50 3x{setup.size}x{setup.size} batch {setup.batch} on {where}, "
        f"torch {torch.__version__}; {setup.steps} timed steps after {setup.warmup} warm-up"
    )
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for precision in precisions:
        if cuda and precision in ("bf16", "tf32") and torch.cuda.get_device_capability()[0] < 8:
            print(f"{precision}: skipped (needs compute capability >= 8.0)")
            continue
        results[precision] = {}
        for name, fn in (("bare", bare), ("engine", engine)):
            results[precision][name] = (
                fn(setup, precision) if cuda or opts.in_process else _isolated(fn, setup, precision)
            )
            if cuda:
                torch.cuda.empty_cache()
    print(table(results))
    ratios = {
        p: r["engine"]["samples_per_second"] / r["bare"]["samples_per_second"]
        for p, r in results.items()
    }
    print("engine/bare " + ", ".join(f"{p} {ratio:.2f}" for p, ratio in ratios.items()))
    checks = verdicts(results) if BASELINE in results and {"fp16", "bf16"} <= set(results) else {}
    for goal, met in checks.items():
        print(f"goal {goal}: {'MET' if met else 'NOT MET'}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {"device": where, "setup": asdict(setup), "results": results, "goals": checks},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
