"""How fast the data path delivers 3x224x224 synthetic images at batch 256, and how much of the
step the training loop waits on data.

Images per second, side by side in one run:

- ``old per-sample``: synthetic-images as it was first (a generator, a roll and a ``randn``
  per image, in the training thread), the baseline;
- ``host batch()``: ``SyntheticImages.batch``, a whole batch at a time in one thread;
- ``Feeder, batch()+pin``: the engine's prefetching Feeder as it was before the host-built
  path, and as it still serves datasets that only have ``batch``: one thread builds the
  batch in pageable memory, ``pin_memory()`` copies it again (CUDA), then the copy;
- ``Feeder, host-built``: the same dataset through ``fill``: built straight into reused
  host buffers (pinned on CUDA) by several threads, each copy queued as soon as its batch
  is complete;
- ``on device`` (CUDA): ``SyntheticImages.batch_on``, built on the GPU: what a CUDA job with
  this dataset actually uses.

Loop waits on data: the Trainer trains a model for a few steps with batches prepared ahead
(depth 2, as on CUDA) and the Feeder's ``wait_s`` (time the training thread was blocked on
a batch not ready yet) is divided by the steady-state time: the product path (on the GPU),
the host-built path and the old ``batch()``+pin path. CUDA: ResNet-50 in bf16 at batch
256; CPU: the built-in ``cnn``. Goals: host batch() >= 10x old on a CPU; the loop waits on
data < 2% of the step on a GPU (product and host-built paths).

JPEG (``--jpeg``, :mod:`bench.jpeg_path`): real photographs as JPEG bytes in memory, decoded
and cropped to 224 px by torchvision with 0 loader processes (one thread) and 1, 2, ...
(``--jpeg-workers``): images/s per process, whether 2 threads beat one (the GIL), and the
share of each step the loop waits on data with each count. ``--jpeg-only`` skips the rest.

    python bench/data_path.py [--device cpu|cuda] [--batches 5] [--size 224] [--json out.json]
    python -m bench.data_path --jpeg-only [--jpeg-workers 0,1,2] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from amptrain.components import registry
from amptrain.components.sampling import generator
from amptrain.components.synthetic_images import SyntheticImages
from amptrain.contract.spec import ComponentRef, parse_spec
from amptrain.engine import Components, RunContext, Trainer
from amptrain.engine.data import Feeder, default_builders

CLASSES = 1000
GOALS = {"speedup_vs_old": 10.0, "data_wait_fraction": 0.02}
CPU = torch.device("cpu")


class OldPerSample:
    """The per-sample synthetic-images of before (same kind of patterns, one image at a time)."""

    def __init__(self, size: int, seed: int, data_seed: int = 0, noise: float = 0.5) -> None:
        self.shape = (3, size, size)
        self.seed, self.data_seed, self.noise = seed, data_seed, noise
        g = generator(data_seed, 0x1A6E)
        coarse = torch.randn(CLASSES, 3, 4, 4, generator=g)
        fine = torch.randn(CLASSES, 3, 8, 8, generator=g) * 0.5
        patterns = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
        patterns += F.interpolate(fine, size=(size, size), mode="bilinear", align_corners=False)
        self.patterns = (patterns - patterns.mean((1, 2, 3), keepdim=True)) / patterns.std(
            (1, 2, 3), keepdim=True
        )
        self.max_shift = (size // 8, size // 8)

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        g = generator(self.seed, self.data_seed, index)
        label = int(torch.randint(CLASSES, (1,), generator=g))
        sy, sx = (int(torch.randint(-m, m + 1, (1,), generator=g)) for m in self.max_shift)
        image = torch.roll(self.patterns[label], shifts=(sy, sx), dims=(1, 2))
        return image + self.noise * torch.randn(image.shape, generator=g), label

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.empty(size, *self.shape)
        labels = torch.empty(size, dtype=torch.long)
        for j in range(size):
            images[j], labels[j] = self.sample(start + j)
        return images, labels


class BatchOnly:
    """A dataset with ``batch`` alone: the Feeder's one-thread path (build, then pin)."""

    def __init__(self, inner: SyntheticImages) -> None:
        self.inner, self.info = inner, inner.info

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.batch(start, size)


class HostBuilt(BatchOnly):
    """``batch`` and ``fill`` but no ``batch_on``: the Feeder's host-built path."""

    def fill(self, start: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inner.fill(start, inputs, targets)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(
    make: Any, batch: int, batches: int, device: torch.device, sustained: bool = False
) -> float:
    """The median over ``batches`` timed calls (robust to a busy shared machine), after one
    untimed call (first-touch page faults, the host patterns, device copies of tables).
    ``sustained`` (a prefetching Feeder, whose calls overlap): total time over the calls,
    after as many untimed ones as it keeps buffers for (their first-touch page faults)."""
    if sustained:
        for i in range(4):
            make(i * batch)
        _sync(device)
        started = time.perf_counter()
        for i in range(4, 4 + batches):
            make(i * batch)
        _sync(device)
        return batches * batch / (time.perf_counter() - started)
    make(0)
    times = []
    for i in range(1, batches + 1):
        _sync(device)
        started = time.perf_counter()
        make(i * batch)
        _sync(device)
        times.append(time.perf_counter() - started)
    return batch / statistics.median(times)


def images(size: int) -> SyntheticImages:
    data = registry.build_dataset(
        ComponentRef(
            name="synthetic-images", args={"height": size, "width": size, "classes": CLASSES}
        ),
        seed=0,
    )
    assert isinstance(data, SyntheticImages)
    return data


def throughputs(
    device: torch.device, size: int, batch: int, batches: int, old_images: int, builders: int
) -> dict[str, float]:
    new = images(size)
    old = OldPerSample(size, seed=0)
    out = {
        "old per-sample": images_per_second(lambda s: old.batch(s, old_images), old_images, 3, CPU),
        "host batch()": images_per_second(lambda s: new.batch(s, batch), batch, batches, CPU),
    }
    paths = {"Feeder, batch()+pin": BatchOnly(new), "Feeder, host-built": HostBuilt(new)}
    for name, data in paths.items():
        feeder = Feeder(data, device, depth=2, builders=builders)
        try:  # over more batches than it prefetches: the sustained rate
            out[name] = images_per_second(
                lambda s, f=feeder: f.get(s, batch), batch, batches + 4, device, sustained=True
            )
        finally:
            feeder.close()
    if device.type == "cuda":
        out["on device"] = images_per_second(
            lambda s: new.batch_on(s, batch, device), batch, max(batches, 10), device
        )
    return out


class Prefetching(Trainer):
    prefetch_depth = 2  # what CUDA jobs get (a CPU job builds inline by default)


def wait_spec(device: torch.device, size: int, steps: int, warmup: int, **extra: Any) -> Any:
    """The job the data-wait measurements train: ResNet-50 bf16 at batch 256 on CUDA, the
    built-in ``cnn`` at batch 32 on a CPU."""
    cuda = device.type == "cuda"
    return parse_spec(
        {
            "model": (
                {"name": "resnet50"} if cuda else {"name": "cnn", "args": {"width": 16, "depth": 2}}
            ),
            "dataset": {
                "name": "synthetic-images",
                "args": {"height": size, "width": size, "classes": CLASSES},
            },
            "max_steps": warmup + steps + 1,
            "batch_size": 256 if cuda else 32,
            "precision": "bf16" if cuda else "fp32",
            "device": device.type,
            "optimizer": {"name": "sgd", "lr": 0.1},
            **extra,
        }
    )


def steady_wait(
    spec: Any, data: Any, device: torch.device, warmup: int, builders: int | None = None
) -> dict[str, Any]:
    """Train ``spec`` on ``data`` through the Trainer; the share of the steady state (the
    steps after ``warmup``) spent waiting for data."""
    steps = spec.max_steps - warmup - 1
    torch.manual_seed(0)
    model = registry.build_model(spec.model, data.info)
    parts = Components(model, data, registry.loss_for(data.info))
    marks: dict[str, float] = {}

    def at_boundary() -> None:
        if trainer.step in (warmup, warmup + steps):
            _sync(device)
            key = "start" if trainer.step == warmup else "end"
            marks[key], marks[f"wait_{key}"] = time.perf_counter(), trainer.feeder.wait_s

    Prefetching.data_builders = builders
    trainer = Prefetching(spec, RunContext(None, should_stop=at_boundary), parts)
    trainer.train()
    elapsed = marks["end"] - marks["start"]
    return {
        "model": "resnet50 bf16" if device.type == "cuda" else "cnn w16 d2 fp32",
        "batch": spec.batch_size,
        "step_ms": elapsed / steps * 1e3,
        "data_wait_fraction": (marks["wait_end"] - marks["wait_start"]) / elapsed,
        "on_device": trainer.feeder.on_device,
        "builders": trainer.feeder.builders,
    }


def data_wait(
    device: torch.device, path: str, size: int, steps: int, warmup: int, builders: int
) -> dict[str, Any]:
    """The data wait of the synthetic images built by ``path``'s way."""
    data: Any = images(size)
    data = {"product": data, "host-built": HostBuilt(data), "batch()+pin": BatchOnly(data)}[path]
    return steady_wait(wait_spec(device, size, steps, warmup), data, device, warmup, builders)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224, help="image side (224)")
    parser.add_argument("--batches", type=int, default=5, help="timed batches per path")
    parser.add_argument("--old-images", type=int, default=16, help="images per timed old call")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (20 CUDA, 4 CPU)")
    parser.add_argument(
        "--builders", type=int, default=None, help="host-built threads (the engine's default)"
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--jpeg", action="store_true", help="also the JPEG decode path")
    parser.add_argument("--jpeg-only", action="store_true", help="only the JPEG decode path")
    parser.add_argument("--jpeg-workers", default="0,1,2", help="loader process counts")
    opts = parser.parse_args()
    kind = (
        opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    device = torch.device(kind)
    builders = opts.builders or default_builders()
    where = (
        torch.cuda.get_device_name()
        if kind == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    print(
        f"data_path: 3x{opts.size}x{opts.size} synthetic images, batch {opts.batch}, on {where}; "
        f"host-built with {builders} builder thread(s)"
    )

    if opts.jpeg or opts.jpeg_only:
        from bench.jpeg_path import jpeg_report

        workers = [int(n) for n in opts.jpeg_workers.split(",")]
        jpeg = jpeg_report(device, workers, opts.steps or (20 if kind == "cuda" else 4))
        if opts.jpeg_only:
            if opts.json:
                with open(opts.json, "w") as f:
                    json.dump({"device": where, "jpeg": jpeg}, f, indent=2)
            return
    rates = throughputs(device, opts.size, opts.batch, opts.batches, opts.old_images, builders)
    old = rates["old per-sample"]
    for name, rate in rates.items():
        print(f"  {name:20} {rate:10,.0f} images/s  {rate / old:7.1f}x old")
    speedup = rates["host batch()"] / old
    if opts.size == 224:
        print(
            f"goal host batch() >= {GOALS['speedup_vs_old']:.0f}x old: "
            f"{'MET' if speedup >= GOALS['speedup_vs_old'] else 'NOT MET'} ({speedup:.1f}x)"
        )
    else:  # small images: the old per-image overhead shrinks with them
        print(f"host batch() {speedup:.1f}x old (the 10x goal is judged at 224 px)")
    steps = opts.steps or (20 if kind == "cuda" else 4)
    warmup = 5 if kind == "cuda" else 1
    waits = {
        path: data_wait(device, path, opts.size, steps, warmup, builders)
        for path in ("product", "host-built", "batch()+pin")
    }
    for name, w in waits.items():
        how = "built on the device" if w["on_device"] else f"{w['builders']} thread(s)"
        print(
            f"  data wait, {name:11} ({w['model']}, batch {w['batch']}, {how}): "
            f"{w['data_wait_fraction']:.2%} of {w['step_ms']:.1f} ms steps"
        )
    print(
        "loop waits on data: "
        + ", ".join(f"{n} {w['data_wait_fraction']:.2%}" for n, w in waits.items())
        + f" of the step ({kind})"
    )
    if kind == "cuda":
        worst = max(waits[p]["data_wait_fraction"] for p in ("product", "host-built"))
        met = worst < GOALS["data_wait_fraction"]
        print(
            f"goal data wait < 2% of step time (GPU, product and host-built): "
            f"{'MET' if met else 'NOT MET'} ({worst:.2%})"
        )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "device": where,
                    "builders": builders,
                    "images_per_second": rates,
                    "data_wait": waits,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
