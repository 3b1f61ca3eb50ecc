"""One rank of the FSDP scenarios of ``test_fsdp.py`` (run under torchrun, not collected).

``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
tests.engine.fsdp_ranks OUT`` joins one gloo group and trains, as this rank, in sequence:

- ``bf16``: the same 2-device bf16 transformer job with ddp and fsdp, each with and without
  activation checkpointing; each run's losses (rank 0's series), the type of its parameters,
  each rank's training-state bytes (parameters + gradients + optimizer state) and how many
  forwards its first block ran;
- ``memory``: the same for an MLP wide enough that its state dwarfs everything else,
  evaluating 3 held-out chunks on 2 ranks (an fsdp forward is a collective: the rank with
  fewer chunks must keep in step);
- ``fp16``: a 2-device fsdp fp16 job whose rank 1 alone gets an inf in its own gradient shard
  at step ``OVERFLOW_STEP`` (after the reduce-scatter, before the optimizer step: what no
  other rank can see); each rank's loss scale and skipped flag at every step;
- ``resume``: an fsdp job stopped at step ``STOP_AT`` (a preemption: it checkpoints) and
  resumed from its sharded checkpoint, against the same job uninterrupted: both runs' losses
  and final full weights; the checkpoint resumed with ddp, which must be refused; and a new
  fsdp job starting from the weights exported beside the last checkpoint (``weights``).

Everything goes to ``OUT/rank{r}.pt``; the test compares.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from amptrain.contract.errors import PreemptedError, ResumeMismatchError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.distributed import Ranks
from amptrain.engine.sharding import blocks, local_state_bytes
from tests.support.ranks import run_scenarios
from tests.support.sinks import ListSink

OVERFLOW_STEP = 3
STOP_AT = 4
UNEVEN_EVAL = {"every_steps": 2, "batches": 3}


def transformer_job(**fields: Any) -> Any:
    """A tiny transformer on token data, 2 devices (its two blocks are the fsdp units)."""
    return parse_spec(
        {
            "model": {"name": "transformer", "args": {"d_model": 32, "n_layers": 2}},
            "dataset": {"name": "synthetic-text", "args": {"vocab_size": 64, "seq_len": 16}},
            "max_steps": 8,
            "batch_size": 8,
            "devices": 2,
            "precision": "bf16",
            "device": "cpu",
            "optimizer": {"name": "adamw", "lr": 0.01},
            "telemetry": {"flush_every_steps": 2},
            "collective_timeout_s": 60,
            "eval": {"enabled": False},
            **fields,
        }
    )


def mlp_job(**fields: Any) -> Any:
    """An MLP whose two hidden 256-wide layers hold nearly all of its parameters."""
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 256}},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 64, "num_samples": 256},
            },
            "max_steps": 4,
            "batch_size": 16,
            "devices": 2,
            "precision": "bf16",
            "device": "cpu",
            "optimizer": {"name": "adamw", "lr": 0.003},
            "loss_scale": {"init_scale": 1024, "growth_interval": 1000},
            "telemetry": {"flush_every_steps": 2},
            "collective_timeout_s": 60,
            "eval": {"enabled": False},
            **fields,
        }
    )


def trained(spec: Any, ranks: Ranks, checkpoints: str | None = None) -> tuple[Trainer, ListSink]:
    sink = ListSink()
    trainer = Trainer(spec, RunContext(checkpoints, sink=sink, ranks=ranks))
    # Forwards of the first block's first Linear: a checkpointed block runs its forward again
    # in the backward.
    first = next(m for m in blocks(trainer.model)[0].modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda *_: trainer.forwards.append(trainer.step))  # type: ignore[attr-defined]
    trainer.forwards = []  # type: ignore[attr-defined]
    trainer.train()
    return trainer, sink


def losses(sink: ListSink) -> list[float]:
    return [m["loss"] for _, m in sorted(sink.metrics().items())]


def described(trainer: Trainer, sink: ListSink) -> dict[str, Any]:
    params = list(trainer.model.parameters())
    return {
        "losses": losses(sink),
        "param_types": sorted({type(p).__name__ for p in params}),
        "state_bytes": local_state_bytes(trainer.model, trainer.optimizer),
        "device": trainer.parts.precision.device,
        "first_block_forwards": len(trainer.forwards),  # type: ignore[attr-defined]
        "eval": trainer.evaluator.last_values if trainer.evaluator else None,
    }


def compare(job: Any, ranks: Ranks, *, checkpointing: bool, **common: Any) -> dict[str, Any]:
    out = {}
    runs = [("ddp", {}), ("fsdp", {"parallelism": "fsdp"})]
    if checkpointing:
        runs.append(("ddp_ac", {"activation_checkpointing": True}))
        runs.append(("fsdp_ac", {"parallelism": "fsdp", "activation_checkpointing": True}))
    for name, fields in runs:
        out[name] = described(*trained(job(**fields, **common), ranks))
    return out


def fp16(ranks: Ranks) -> dict[str, Any]:
    seen: list[tuple[int, float, float]] = []
    trainer: Trainer
    spec = mlp_job(parallelism="fsdp", precision="fp16", max_steps=5, grad_clip_norm=None)
    sink = ListSink()
    trainer = Trainer(spec, RunContext(None, sink=sink, ranks=ranks))
    apply = trainer.amp.apply

    def poisoned(loss: torch.Tensor) -> Any:
        # Rank 1's own shard of the first weight, once reduced: no other rank holds it.
        if ranks.rank == 1 and trainer.step + 1 == OVERFLOW_STEP:
            grad = next(trainer.model.parameters()).grad
            assert grad is not None
            grad.to_local()[0, 0] = math.inf
        applied = apply(loss)
        assert applied.found_inf is not None and applied.scale is not None
        seen.append((trainer.step + 1, float(applied.found_inf), float(applied.scale)))
        return applied

    trainer.amp.apply = poisoned  # type: ignore[method-assign]
    result = trainer.train()
    assert trainer.amp.scaler is not None
    return {
        "seen": seen,
        "final_scale": trainer.amp.scaler.get_scale(),
        "skipped_steps": result.skipped_steps,
        "metrics": sink.metrics(),
    }


def full_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every parameter whole (a gather of the shards: on every rank)."""
    return {
        n: p.full_tensor().detach().clone()  # type: ignore[attr-defined]
        for n, p in trainer.model.named_parameters()
    }


def resume(ranks: Ranks, out: str) -> dict[str, Any]:
    whole, sink = trained(mlp_job(parallelism="fsdp", max_steps=8), ranks)
    uninterrupted = {"losses": losses(sink), "weights": full_weights(whole)}

    ckpt = str(Path(out) / "ckpt")
    first = ListSink()
    trainer = Trainer(
        mlp_job(parallelism="fsdp", max_steps=8),
        RunContext(ckpt, sink=first, ranks=ranks, should_stop=lambda: None),
    )
    trainer.ctx.should_stop = lambda: "preempt" if trainer.step >= STOP_AT else None
    try:
        trainer.train()
        raise AssertionError("the stop was not taken")
    except PreemptedError as exc:
        stopped_at = exc.step
    dist.barrier()
    second, sink = trained(mlp_job(parallelism="fsdp", max_steps=8), ranks, ckpt)
    resumed = {
        "stopped_at": stopped_at,
        "losses": losses(first) + losses(sink),
        "resumed_from": second.state.resumed_from,
        "weights": full_weights(second),
        "files": sorted(os.listdir(ckpt)),
    }
    try:
        Trainer(mlp_job(max_steps=10), RunContext(ckpt, ranks=ranks)).train()
        refused = None
    except ResumeMismatchError as exc:
        refused = exc.message
    # The weights exported beside the last checkpoint (gathered from the shards) start a job.
    exported = str(Path(ckpt) / "step-000000008.safetensors")
    spec = mlp_job(parallelism="fsdp", max_steps=1, weights={"path": exported})
    started = Trainer(spec, RunContext(None, ranks=ranks, weights_roots=[ckpt]))
    started._resume()  # where train() starts: the weights are loaded, no step taken
    return {
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "ddp_refused": refused,
        "started_from_export": full_weights(started),
    }


def main(out: str) -> None:
    run_scenarios(
        out,
        lambda ranks: {
            "bf16": compare(transformer_job, ranks, checkpointing=True),
            # 3 held-out chunks: rank 0 evaluates 2, rank 1 one (and one more forward, with fsdp).
            "memory": compare(mlp_job, ranks, checkpointing=False, eval=UNEVEN_EVAL),
            "fp16": fp16(ranks),
            "resume": resume(ranks, out),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1])
