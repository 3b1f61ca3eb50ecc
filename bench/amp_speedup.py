"""AMP speed-up: fp32 vs fp16 (+ GradScaler) vs bf16 training throughput and peak memory.

Workloads: an image classifier (torchvision's ResNet-50 when installed, else the
built-in ``cnn``) on synthetic images, and the built-in ``transformer`` on
synthetic text. Each step is the engine's AMP step order: forward + loss under
autocast, ``scaler.scale(loss).backward()``, ``unscale_``, clip, ``scaler.step``,
``scaler.update()``; the optimizer is the registry's (fused AdamW on CUDA). One
fixed batch lives on the device, so data generation is not measured.

Memory: on CUDA the allocator's peak (``max_memory_allocated``) per run; on CPU
the peak growth of the process's resident set over the run (sampled every
millisecond, each run in a fresh process so earlier runs' freed memory does not
hide the next run's). The fp32 baseline is strict fp32 (TF32 off) unless
``--tf32``. CPU note: without AMX, bf16/fp16 autocast on a CPU is emulated and
usually *slower* than fp32; the CPU numbers check the script, not AMP's value.

    python bench/amp_speedup.py                 # CUDA when available, else small CPU sizes
    python bench/amp_speedup.py --device cpu --steps 20 --json results.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import multiprocessing
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class Workload:
    label: str
    model: dict[str, Any]
    dataset: dict[str, Any]
    batch_size: int


def workloads(device: str) -> list[Workload]:
    """Benchmark-scale sizes on CUDA (ResNet-50 at 224x224 as in the published AMP results),
    small ones on a CPU."""
    has_tv = importlib.util.find_spec("torchvision") is not None
    if device == "cuda":
        image = (
            Workload("resnet50 3x224x224", {"name": "resnet50"}, _images(224, 1000), 128)
            if has_tv
            else Workload(
                "cnn w64 d4 3x224x224",
                {"name": "cnn", "args": {"width": 64, "depth": 4}},
                _images(224, 1000),
                128,
            )
        )
        text = Workload(
            "transformer d512 L6 seq256",
            {"name": "transformer", "args": {"d_model": 512, "n_layers": 6, "n_heads": 8}},
            {
                "name": "synthetic-text",
                "args": {"vocab_size": 8192, "seq_len": 256, "num_samples": 256},
            },
            32,
        )
        return [image, text]
    image = (
        Workload("resnet50 3x64x64", {"name": "resnet50"}, _images(64, 10), 8)
        if has_tv
        else Workload(
            "cnn w16 d3 3x32x32",
            {"name": "cnn", "args": {"width": 16, "depth": 3}},
            _images(32, 10),
            32,
        )
    )
    text = Workload(
        "transformer d128 L2 seq64",
        {"name": "transformer", "args": {"d_model": 128, "n_layers": 2, "n_heads": 4}},
        {"name": "synthetic-text", "args": {"vocab_size": 256, "seq_len": 64, "num_samples": 256}},
        16,
    )
    return [image, text]


def _images(size: int, classes: int) -> dict[str, Any]:
    return {
        "name": "synthetic-images",
        "args": {"channels": 3, "height": size, "width": size, "classes": classes},
    }


class RssPeak:
    """Peak resident-set growth while active, sampled by a thread (CPU memory)."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.base


def measure(
    work: Workload, precision: str, device_kind: str, steps: int, warmup: int, tf32: bool
) -> dict[str, Any]:
    """Train ``steps`` timed steps (after ``warmup``) and return throughput and peak memory."""
    import torch

    from trainer_core import registry
    from trainer_core.contract.spec import ComponentRef, OptimizerSpec

    device = torch.device(device_kind)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
        if precision == "bf16" and torch.cuda.get_device_capability(device) < (8, 0):
            return {"skipped": "bf16 needs CUDA capability >= 8.0"}
    torch.manual_seed(0)
    data = registry.build_dataset(ComponentRef(**work.dataset), seed=0)
    model = registry.build_model(ComponentRef(**work.model), data.info).to(device)
    loss_fn = registry.loss_for(data.info)
    optimizer = registry.build_optimizer(OptimizerSpec(lr=1e-4), model.parameters(), device)
    memory_format = (
        torch.channels_last if device.type == "cuda" and len(data.info.input_shape) == 3 else None
    )
    if memory_format is not None:
        model = model.to(memory_format=memory_format)  # type: ignore[call-overload]
    x, y = (t.to(device) for t in data.batch(0, work.batch_size))
    if memory_format is not None:
        x = x.contiguous(memory_format=memory_format)
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rss = RssPeak() if device.type == "cpu" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if rss is not None:
        rss.__enter__()
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    losses = [step() for _ in range(steps)]
    sync()
    elapsed = time.perf_counter() - start
    if rss is not None:
        rss.__exit__()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else rss.growth  # type: ignore[union-attr]
    return {
        "samples_per_second": steps * work.batch_size / elapsed,
        "step_ms": elapsed / steps * 1e3,
        "peak_memory_bytes": int(peak),
        "final_loss": float(torch.stack(losses[-3:]).float().mean()),
    }


def _isolated(*args: Any) -> dict[str, Any]:
    # A fresh process per CPU run: RSS growth is only meaningful from a clean allocator.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(measure, *args).result()


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        f"{'workload':28} {'precision':9} {'samples/s':>11} {'step ms':>9} {'vs fp32':>8} "
        f"{'peak memory':>12} {'vs fp32':>8} {'loss':>7}"
    ]
    for label, runs in results.items():
        base = runs.get("fp32", {})
        for precision, r in runs.items():
            if "skipped" in r:
                lines.append(f"{label:28} {precision:9} {'skipped: ' + r['skipped']}")
                continue
            speed = r["samples_per_second"] / base["samples_per_second"] if base else float("nan")
            mem = (
                r["peak_memory_bytes"] / base["peak_memory_bytes"]
                if base.get("peak_memory_bytes")
                else float("nan")
            )
            lines.append(
                f"{label:28} {precision:9} {r['samples_per_second']:11,.1f} {r['step_ms']:9.2f} "
                f"{speed:7.2f}x {_mib(r['peak_memory_bytes']):>12} {mem:7.2f}x {r['final_loss']:7.3f}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps (default 50 CUDA, 15 CPU)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first (default 10 CUDA, 3 CPU)"
    )
    parser.add_argument(
        "--tf32", action="store_true", help="let the fp32 baseline use TF32 (Ampere+)"
    )
    parser.add_argument("--json", help="also write the results here")
    opts = parser.parse_args()

    import torch

    device = (
        opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    steps = opts.steps or (50 if device == "cuda" else 15)
    warmup = opts.warmup or (10 if device == "cuda" else 3)
    where = (
        torch.cuda.get_device_name()
        if device == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    print(
        f"amp_speedup: {where}, torch {torch.__version__}, {steps} timed steps after {warmup} warm-up"
    )
    if device == "cpu":
        print(
            "note: CPU autocast without AMX is emulated; fp16/bf16 are not expected to be faster here."
        )
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for work in workloads(device):
        results[work.label] = {}
        for precision in PRECISIONS:
            args = (work, precision, device, steps, warmup, opts.tf32)
            results[work.label][precision] = _isolated(*args) if device == "cpu" else measure(*args)
            if device == "cuda":
                torch.cuda.empty_cache()
    print(table(results))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "device": where,
                    "steps": steps,
                    "workloads": [asdict(w) for w in workloads(device)],
                    "results": results,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
