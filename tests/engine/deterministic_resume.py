"""A resumed ``deterministic`` run against an uninterrupted one, bit for bit (not collected).

``python -m tests.engine.deterministic_resume DIR DEVICE`` trains each job of :data:`JOBS`
twice on DEVICE: straight through, and stopped (preempted) at step :data:`STOP` then resumed
from its checkpoint in a new Trainer. It prints, as the last line, one JSON object: per job,
what differs (parameter names, and ``loss@N`` / ``grad_norm@N`` for the steps after the
resume); ``[]`` everywhere means bitwise equal.

The jobs hold the kernels whose CUDA backward uses atomics unless deterministic mode is on:
convolutions (cuDNN's weight-gradient algorithms), scaled-dot-product attention with dropout
(flash / memory-efficient backward), ``index_add_`` (the per-layer gradient norms). On CUDA
it must run in a fresh process with ``CUBLAS_WORKSPACE_CONFIG`` set before its first cuBLAS
call, as the worker's training process has it (``tests/engine/test_gpu.py``); on a CPU
``tests/engine/test_deterministic.py`` calls :func:`differences` in-process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from amptrain.contract.errors import PreemptedError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from tests.support.sinks import ListSink

STEPS, STOP = 8, 4
JOBS: dict[str, dict[str, Any]] = {
    "cnn": {
        "model": {"name": "cnn", "args": {"width": 8, "depth": 2}},
        "dataset": {"name": "synthetic-images", "args": {"height": 16, "width": 16}},
        "telemetry": {"layer_grad_norms_every": 1},
    },
    "transformer": {
        "model": {
            "name": "transformer",
            "args": {"d_model": 32, "n_layers": 2, "n_heads": 2, "dropout": 0.1},
        },
        "dataset": {"name": "synthetic-text", "args": {"seq_len": 16}},
    },
}


def spec(job: str, device: str, precision: str) -> Any:
    return parse_spec(
        {
            **JOBS[job],
            "max_steps": STEPS,
            "batch_size": 16,
            "grad_accum_steps": 2,
            "precision": precision,
            "device": device,
            "deterministic": True,
            "checkpoint": {"every_steps": 2, "keep_last": 2},
        }
    )


def resumed_run(job: Any, split: Path) -> tuple[Trainer, ListSink]:
    """``job`` preempted at step :data:`STOP`, then resumed from its checkpoint in ``split``
    by a new Trainer that trains to the end."""
    first: list[Trainer] = []
    ctx = RunContext(
        str(split), should_stop=lambda: "preempt" if first and first[0].step == STOP else None
    )
    first.append(Trainer(job, ctx))
    try:
        first[0].train()
        raise AssertionError(f"the run was not preempted at step {STOP}")
    except PreemptedError as stopped:
        assert stopped.step == STOP, stopped.step
    sink = ListSink()
    resumed = Trainer(job, RunContext(str(split), sink=sink))
    result = resumed.train()
    assert result.resumed_from == STOP, result
    return resumed, sink


def differences(out: Path, device: str, precision: str) -> dict[str, list[str]]:
    """Per job, what the resumed run has that the straight one does not."""
    found: dict[str, list[str]] = {}
    for name in JOBS:
        job = spec(name, device, precision)
        straight_sink = ListSink()
        straight = Trainer(job, RunContext(None, sink=straight_sink))
        straight.train()
        split = out / name
        split.mkdir(parents=True)  # an existing one would hold checkpoints to resume from
        resumed, resumed_sink = resumed_run(job, split)
        found[name] = [
            param
            for (param, a), (_, b) in zip(
                straight.model.named_parameters(), resumed.model.named_parameters(), strict=True
            )
            if not torch.equal(a, b)
        ]
        before, after = straight_sink.metrics(), resumed_sink.metrics()
        assert sorted(after) == list(range(STOP + 1, STEPS + 1)), sorted(after)
        found[name] += [
            f"{key}@{step}"
            for step in after
            for key in ("loss", "grad_norm")
            if after[step][key] != before[step][key]
        ]
    return found


if __name__ == "__main__":
    device = sys.argv[2]
    on_gpu = device == "cuda"
    precision = "fp32"
    if on_gpu:
        precision = "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp16"
    print(json.dumps(differences(Path(sys.argv[1]), device, precision)))
