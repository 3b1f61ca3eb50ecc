"""CUDA variants: fp16 and bf16 train on the GPU, and ordinary steps never sync with the host."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.support.sinks import ListSink
from trainer_core.contract.spec import parse_spec
from trainer_core.engine import RunContext, Trainer

pytestmark = pytest.mark.gpu


def spec(precision: str, **overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 64}},
            "dataset": {"name": "synthetic-classification"},
            "max_steps": 40,
            "batch_size": 64,
            "precision": precision,
            "device": "cuda",
            "optimizer": {"name": "adamw", "lr": 3e-3},
            **overrides,
        }
    )


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_low_precision_trains_on_cuda(precision: str) -> None:
    if precision == "bf16" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 needs compute capability >= 8.0")
    sink = ListSink()
    result = Trainer(spec(precision), RunContext(None, sink=sink)).train()
    metrics = [r for r in sink.items if r["kind"] == "metric"]
    assert result.precision.effective == precision and len(metrics) == 40
    assert math.isfinite(metrics[-1]["loss"]) and metrics[-1]["loss"] < metrics[0]["loss"]
    assert metrics[-1]["memory_allocated"] > 0  # CUDA allocator figures
    assert (metrics[-1]["loss_scale"] is not None) == (precision == "fp16")


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_steps_between_flushes_do_not_sync(precision: str) -> None:
    if precision == "bf16" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 needs compute capability >= 8.0")
    # fp16 starts with an overflowing scale so skipped steps (and the LR gate) are exercised.
    overrides = {"loss_scale": {"init_scale": 2.0**24, "growth_interval": 2}}
    trainer = Trainer(
        spec(
            precision, telemetry={"flush_every_steps": 1000, "flush_every_ms": 600_000}, **overrides
        ),
        RunContext(None),
    )
    trainer.train_step()  # warm-up: lazy optimizer state, kernels, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            trainer.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    trainer.telemetry.flush()
    last = trainer.telemetry.last_record
    assert last is not None and last["step"] == 11 and math.isfinite(last["loss"])
    if precision == "fp16":
        assert trainer.telemetry.skipped_steps > 0
