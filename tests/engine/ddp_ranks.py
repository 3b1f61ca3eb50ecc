"""One rank of the in-process DDP scenarios of ``test_ddp.py`` (run under torchrun, not collected).

``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
tests.engine.ddp_ranks OUT`` joins one gloo group and trains, as this rank:

- ``fp32``: a 2-device fp32 job, its micro-batches built ahead as on CUDA; each rank saves
  its final parameters, its final evaluation and how many batches it built and found not
  prepared;
- ``fp16``: a 2-device fp16 job whose rank 1 alone gets inf gradients at step
  ``OVERFLOW_STEP`` (a gradient hook, the seam ``test_amp.py`` uses), recording per-layer
  gradient norms every step; each rank saves its loss scale and a parameter digest at every
  step boundary, rank 0 its records;
- ``bn``: a 2-device job on a BatchNorm model, evaluating; each rank saves its evaluation,
  its final state and its running statistics as its own last training forward left them;
  and the buffers of a module of mixed dtypes after ``Group.share_leader_buffers``.

- ``library``: a 2-device job on scikit-learn's digits (``OUT/digits.npz``, written by the
  test) evaluating torchmetrics metrics (macro F1, AUROC, ..., the confusion matrix), which
  torchmetrics gathers across the ranks; each rank saves its evaluation, its final state
  and the confusion-matrix events its sink got.

Everything goes to ``OUT/rank{r}.pt``; the test compares it with single-process runs.
"""

from __future__ import annotations

import hashlib
import math
import sys
from typing import Any

import torch

from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.distributed import Group, Ranks
from tests.support.ranks import run_scenarios
from tests.support.sinks import ListSink

OVERFLOW_STEP = 3


def job(precision: str, devices: int, grad_accum_steps: int) -> Any:
    """The scenarios' spec; 1 device with 2 accumulation steps is the 2-device job's twin."""
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 32}},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 16, "num_samples": 512},
            },
            "max_steps": 8,
            "batch_size": 16,
            "grad_accum_steps": grad_accum_steps,
            "devices": devices,
            "precision": precision,
            "device": "cpu",
            "schedule": {"name": "cosine", "warmup_steps": 2},
            "loss_scale": {"init_scale": 1024, "growth_interval": 1000},
            "telemetry": {"flush_every_steps": 2},
            "collective_timeout_s": 60,
            # 48 held-out rows in 6 micro-batches, 3 per rank: the sums must add up to one device's.
            "eval": {"every_steps": 4, "batches": 3},
        }
    )


def bn_job(devices: int, grad_accum_steps: int) -> Any:
    """A BatchNorm model: its running statistics are buffers each rank's forwards update from
    the rank's own share of the batch."""
    return parse_spec(
        {
            "model": {"name": "cnn", "args": {"width": 4, "depth": 1}},
            "dataset": {
                "name": "synthetic-images",
                "args": {"channels": 1, "height": 8, "width": 8, "classes": 4},
            },
            "max_steps": 4,
            "batch_size": 16,
            "grad_accum_steps": grad_accum_steps,
            "devices": devices,
            "precision": "fp32",
            "device": "cpu",
            "collective_timeout_s": 60,
            "eval": {"every_steps": 2, "batches": 2},
        }
    )


LIBRARY_METRICS = ["accuracy", "f1_macro", "precision_macro", "recall_macro", "auroc_macro"]


def library_job(devices: int, grad_accum_steps: int) -> Any:
    """Digits (359 held-out rows: 23 micro-batches of 16, 12 on rank 0 and 11 on rank 1)."""
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 32}},
            "dataset": {"name": "tensors", "args": {"path": "digits.npz", "val_fraction": 0.2}},
            "max_steps": 10,
            "batch_size": 32,
            "grad_accum_steps": grad_accum_steps,
            "devices": devices,
            "precision": "fp32",
            "device": "cpu",
            "optimizer": {"name": "adamw", "lr": 0.003},
            "collective_timeout_s": 60,
            "eval": {"batches": 100, "metrics": [*LIBRARY_METRICS, "confusion_matrix"]},
        }
    )


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


class Prefetching(Trainer):
    prefetch_depth = 2  # what CUDA jobs get: each rank's share built ahead, at its stride


def fp32(ranks: Ranks) -> dict[str, Any]:
    trainer = Prefetching(job("fp32", 2, 1), RunContext(None, ranks=ranks))
    result = trainer.train()
    return {
        "eval": result.eval,
        "state": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "built": trainer.feeder.built,
        "misses": trainer.feeder.misses,
    }


def fp16(ranks: Ranks) -> dict[str, Any]:
    sink = ListSink()
    seen: list[tuple[int, float, str]] = []
    trainer: Trainer

    def observe() -> None:  # at every step boundary (test only: host reads are fine here)
        scaler = trainer.amp.scaler
        assert scaler is not None
        seen.append((trainer.step, scaler.get_scale(), digest(trainer.model)))

    spec = job("fp16", 2, 1)
    # Per-layer norms every step: they ride in the flush's all-gather with the step values.
    layered = spec.telemetry.model_copy(update={"layer_grad_norms_every": 1})
    trainer = Trainer(
        spec.model_copy(update={"telemetry": layered}),
        RunContext(None, sink=sink, ranks=ranks, should_stop=observe),
    )
    if ranks.rank == 1:
        next(trainer.model.parameters()).register_hook(
            lambda g: torch.full_like(g, math.inf) if trainer.step + 1 == OVERFLOW_STEP else g
        )
    result = trainer.train()
    observe()
    layers = [r for r in sink.items if r["kind"] == "layer_grad_norm"]
    return {
        "seen": seen,
        "metrics": sink.metrics(),
        "skipped_steps": result.skipped_steps,
        "layers": {r["step"]: r["values"] for r in layers},
    }


def bn(ranks: Ranks) -> dict[str, Any]:
    trainer = Trainer(bn_job(2, 1), RunContext(None, ranks=ranks))
    own: dict[str, torch.Tensor] = {}

    def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
        if module.training:  # after each training forward: this rank's statistics
            own.update({n: b.clone() for n, b in module.named_buffers()})

    trainer.model.register_forward_hook(keep)
    result = trainer.train()
    # Rank-dependent buffers whose byte offsets do not suit the next one's dtype (6 bytes of
    # float16, then an int64), and one not contiguous.
    mixed = torch.nn.Module()
    mixed.register_buffer("fp16", torch.full((3,), ranks.rank + 0.5, dtype=torch.float16))
    mixed.register_buffer("count", torch.tensor(10 + ranks.rank))
    mixed.register_buffer("flags", torch.tensor([ranks.rank == 0, True]))
    mixed.register_buffer("grid", torch.arange(6.0).reshape(2, 3).t() * (ranks.rank + 1))
    Group(ranks, torch.device("cpu")).share_leader_buffers(mixed)
    return {
        "eval": result.eval,
        "own": own,
        "state": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "mixed": dict(mixed.named_buffers()),
    }


def library(ranks: Ranks, out: str) -> dict[str, Any]:
    sink = ListSink()
    ctx = RunContext(None, sink=sink, ranks=ranks, data_roots=[out])
    trainer = Trainer(library_job(2, 1), ctx)
    result = trainer.train()
    return {
        "eval": result.eval,
        "state": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "matrices": [e["data"] for e in sink.events("confusion_matrix")],
    }


def main(out: str) -> None:
    run_scenarios(
        out,
        lambda ranks: {
            "fp32": fp32(ranks),
            "fp16": fp16(ranks),
            "bn": bn(ranks),
            "library": library(ranks, out),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1])
