"""Every built-in model/dataset pair really learns, at fp32, bf16 and fp16 with loss scaling.

Runs the real engine on the CPU with a small step budget (a second or so each)."""

from __future__ import annotations

from typing import Any

import pytest

from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from tests.support.sinks import ListSink

pytestmark = pytest.mark.heavy

PAIRS: dict[str, dict[str, Any]] = {
    "mlp": {
        "model": {"name": "mlp", "args": {"width": 64}},
        "dataset": {"name": "synthetic-classification", "args": {"features": 16}},
        "max_steps": 80,
        "batch_size": 32,
        "optimizer": {"lr": 1e-2},
    },
    "cnn": {
        "model": {"name": "cnn", "args": {"width": 8, "depth": 2}},
        "dataset": {"name": "synthetic-images", "args": {"channels": 3, "height": 8, "width": 8}},
        "max_steps": 60,
        "batch_size": 32,
        "optimizer": {"lr": 1e-2},
    },
    "transformer": {
        "model": {"name": "transformer", "args": {"d_model": 32, "n_layers": 1, "n_heads": 2}},
        "dataset": {"name": "synthetic-text", "args": {"vocab_size": 32, "seq_len": 16}},
        "max_steps": 60,
        "batch_size": 16,
        "optimizer": {"lr": 1e-2},
    },
}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_builtin_pair_halves_its_loss(pair: str, precision: str) -> None:
    spec = parse_spec(
        {**PAIRS[pair], "precision": precision, "device": "cpu", "schedule": {"name": "constant"}}
    )
    sink = ListSink()
    result = Trainer(spec, RunContext(checkpoint_dir=None, sink=sink)).train()
    assert result.precision.effective == precision
    records = [r for r in sink.items if r["kind"] == "metric"]
    assert [r["step"] for r in records] == list(range(1, spec.max_steps + 1))
    if precision == "fp16":
        assert all(r["loss_scale"] for r in records)
    losses = [r["loss"] for r in records if not r["skipped"]]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, f"{pair}/{precision}: loss {first:.3f} -> {last:.3f}"
