"""How fast the data path delivers 3x224x224 synthetic images at batch 256, and how long the
training loop waits for data.

Images per second, in one run:

- ``old per-sample``: synthetic-images as it was before (a generator, a roll and a ``randn``
  per image, in the training thread), kept here as the baseline;
- ``new host batch``: ``SyntheticImages.batch``, a whole batch at a time on the host;
- ``new via Feeder``: the same through the engine's prefetching Feeder as the training loop
  receives it (pinned and copied to the GPU on a side stream on CUDA);
- ``new on device`` (CUDA): ``SyntheticImages.batch_on``, built on the GPU, what a CUDA job
  with this dataset actually uses.

Data wait: the Trainer trains a model for a few steps and the Feeder's ``wait_s`` (time
the training thread was blocked on a batch not ready yet) is divided by the steady-state
time. CUDA: ResNet-50 in bf16 at batch 256, once with the product path (images built on
the GPU) and once forced through the host path. CPU: the built-in ``cnn`` at batch 32.
Goals: new >= 10x old on a CPU; data wait < 2% of step time on a GPU.

    python bench/data_path.py [--device cpu|cuda] [--batches 3] [--json out.json]
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
from amptrain.components.resnet import resnet50
from amptrain.components.sampling import generator
from amptrain.components.synthetic import SyntheticImages
from amptrain.contract.spec import ComponentRef, parse_spec
from amptrain.engine import Components, RunContext, Trainer
from amptrain.engine.data import Feeder

SHAPE = (3, 224, 224)
CLASSES = 1000
GOALS = {"speedup_vs_old": 10.0, "data_wait_fraction": 0.02}


class OldPerSample:
    """The per-sample synthetic-images of before (same patterns, one image at a time)."""

    def __init__(self, seed: int, data_seed: int = 0, noise: float = 0.5) -> None:
        c, h, w = SHAPE
        self.seed, self.data_seed, self.noise = seed, data_seed, noise
        g = generator(data_seed, 0x1A6E)
        coarse = torch.randn(CLASSES, c, 4, 4, generator=g)
        fine = torch.randn(CLASSES, c, 8, 8, generator=g) * 0.5
        patterns = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
        patterns += F.interpolate(fine, size=(h, w), mode="bilinear", align_corners=False)
        self.patterns = (patterns - patterns.mean((1, 2, 3), keepdim=True)) / patterns.std(
            (1, 2, 3), keepdim=True
        )
        self.max_shift = (h // 8, w // 8)

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        g = generator(self.seed, self.data_seed, index)
        label = int(torch.randint(CLASSES, (1,), generator=g))
        sy, sx = (int(torch.randint(-m, m + 1, (1,), generator=g)) for m in self.max_shift)
        image = torch.roll(self.patterns[label], shifts=(sy, sx), dims=(1, 2))
        return image + self.noise * torch.randn(image.shape, generator=g), label

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.empty(size, *SHAPE)
        labels = torch.empty(size, dtype=torch.long)
        for j in range(size):
            images[j], labels[j] = self.sample(start + j)
        return images, labels


class HostOnly:
    """A dataset without ``batch_on``: forces the engine's host path (prefetch, pinned copy)."""

    def __init__(self, inner: SyntheticImages) -> None:
        self.inner, self.info = inner, inner.info

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.batch(start, size)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(
    make: Any, batch: int, batches: int, device: torch.device, warm: bool = True
) -> float:
    """Warm: the median over ``batches`` timed calls (robust to a busy shared machine).
    Cold (a prefetching Feeder, whose calls overlap): total time over all calls."""
    if not warm:
        _sync(device)
        started = time.perf_counter()
        for i in range(1, batches + 1):
            make(i * batch)
        _sync(device)
        return batches * batch / (time.perf_counter() - started)
    make(0)  # warm-up (first-touch page faults, device copies of the patterns)
    times = []
    for i in range(1, batches + 1):
        _sync(device)
        started = time.perf_counter()
        make(i * batch)
        _sync(device)
        times.append(time.perf_counter() - started)
    return batch / statistics.median(times)


def throughputs(
    device: torch.device, batch: int, batches: int, old_images: int
) -> dict[str, float]:
    new = registry.build_dataset(
        ComponentRef(
            name="synthetic-images",
            args={"height": SHAPE[1], "width": SHAPE[2], "classes": CLASSES},
        ),
        seed=0,
    )
    assert isinstance(new, SyntheticImages)
    old = OldPerSample(seed=0)
    out = {
        "old per-sample": images_per_second(lambda s: old.batch(s, old_images), old_images, 3, CPU),
        "new host batch": images_per_second(lambda s: new.batch(s, batch), batch, batches, CPU),
    }
    feeder = Feeder(HostOnly(new), device, depth=2)
    try:  # from cold, over more batches than it prefetches: the sustained rate, not a head start
        out["new via Feeder"] = images_per_second(
            lambda s: feeder.get(s, batch), batch, batches + 2 * feeder.depth, device, warm=False
        )
    finally:
        feeder.close()
    if device.type == "cuda":
        out["new on device"] = images_per_second(
            lambda s: new.batch_on(s, batch, device), batch, max(batches, 10), device
        )
    return out


def data_wait(device: torch.device, host_path: bool, steps: int, warmup: int) -> dict[str, Any]:
    """Train through the Trainer; the share of the steady state spent waiting for data."""
    cuda = device.type == "cuda"
    size, batch = (224, 256) if cuda else (224, 32)
    spec = parse_spec(
        {
            "model": {"name": "cnn", "args": {"width": 16, "depth": 2}},
            "dataset": {
                "name": "synthetic-images",
                "args": {"height": size, "width": size, "classes": CLASSES},
            },
            "max_steps": warmup + steps + 1,
            "batch_size": batch,
            "precision": "bf16" if cuda else "fp32",
            "device": device.type,
            "optimizer": {"name": "sgd", "lr": 0.1},
        }
    )
    data = registry.build_dataset(spec.dataset, seed=0)
    assert isinstance(data, SyntheticImages)
    torch.manual_seed(0)
    model = resnet50(data.info) if cuda else registry.build_model(spec.model, data.info)
    parts = Components(model, HostOnly(data) if host_path else data, registry.loss_for(data.info))
    marks: dict[str, float] = {}

    def at_boundary() -> None:
        if trainer.step in (warmup, warmup + steps):
            _sync(device)
            key = "start" if trainer.step == warmup else "end"
            marks[key], marks[f"wait_{key}"] = time.perf_counter(), trainer.feeder.wait_s

    trainer = Trainer(spec, RunContext(None, should_stop=at_boundary), parts)
    trainer.train()
    elapsed = marks["end"] - marks["start"]
    return {
        "model": "resnet50" if cuda else "cnn w16 d2",
        "batch": batch,
        "step_ms": elapsed / steps * 1e3,
        "data_wait_fraction": (marks["wait_end"] - marks["wait_start"]) / elapsed,
        "on_device": trainer.feeder.on_device,
    }


CPU = torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=5, help="timed batches per new path")
    parser.add_argument("--old-images", type=int, default=16, help="images per timed old call (3)")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed train steps (20 CUDA, 4 CPU)"
    )
    parser.add_argument("--json", help="also write the results here")
    opts = parser.parse_args()
    kind = (
        opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    device = torch.device(kind)
    where = (
        torch.cuda.get_device_name()
        if kind == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    print(f"data_path: 3x224x224 synthetic images, batch {opts.batch}, on {where}")

    rates = throughputs(device, opts.batch, opts.batches, opts.old_images)
    old = rates["old per-sample"]
    for name, rate in rates.items():
        print(f"  {name:16} {rate:10,.0f} images/s  {rate / old:7.1f}x old")
    speedup = rates["new host batch"] / old
    print(
        f"goal new host batch >= {GOALS['speedup_vs_old']:.0f}x old: "
        f"{'MET' if speedup >= GOALS['speedup_vs_old'] else 'NOT MET'} ({speedup:.1f}x)"
    )
    steps = opts.steps or (20 if kind == "cuda" else 4)
    warmup = 5 if kind == "cuda" else 1
    waits = {
        "product path": data_wait(device, host_path=False, steps=steps, warmup=warmup),
        "host path": data_wait(device, host_path=True, steps=steps, warmup=warmup),
    }
    for name, w in waits.items():
        print(
            f"  data wait, {name:12} ({w['model']}, batch {w['batch']}, "
            f"{'built on the device' if w['on_device'] else 'prefetched on the host'}): "
            f"{w['data_wait_fraction']:.2%} of {w['step_ms']:.1f} ms steps"
        )
    if kind == "cuda":
        worst = max(w["data_wait_fraction"] for w in waits.values())
        met = worst < GOALS["data_wait_fraction"]
        print(
            f"goal data wait < 2% of step time (GPU): {'MET' if met else 'NOT MET'} ({worst:.2%})"
        )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {"device": where, "images_per_second": rates, "data_wait": waits}, f, indent=2
            )


if __name__ == "__main__":
    main()
