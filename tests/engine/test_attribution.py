"""Overflow attribution: a skipped fp16 step's warning names the parameter whose gradient
overflowed first (in backward order), and the run counts the offenders."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from amptrain.contract.records import OVERFLOW_WARNING
from amptrain.engine import RunContext, Trainer
from amptrain.engine.attribution import first_nonfinite
from tests.engine.test_amp import components, spec
from tests.support.sinks import ListSink

INJECT_AT = {3, 5}  # the steps (1-based) whose gradients overflow


class Blocks(nn.Module):
    """Three Linear layers under ``blocks`` (module paths blocks.0 .. blocks.2)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = block(x) if i == len(self.blocks) - 1 else F.gelu(block(x))
        return x


def _overflow_warnings(sink: ListSink) -> dict[int, dict[str, Any]]:
    return {
        e["step"]: e["data"]
        for e in sink.events("warning")
        if e["data"]["code"] == OVERFLOW_WARNING
    }


def _trainer(sink: ListSink) -> Trainer:
    # A scale that never overflows on its own: only the injected steps are skipped.
    return Trainer(
        spec(precision="fp16", max_steps=6, loss_scale={"init_scale": 256}),
        RunContext(None, sink=sink),
        components(Blocks),
    )


def test_a_weight_gradient_made_inf_is_named_and_counted() -> None:
    sink = ListSink()
    trainer = _trainer(sink)
    weight = trainer.model.blocks[1].weight  # type: ignore[index,union-attr]
    weight.register_hook(
        lambda g: torch.full_like(g, math.inf) if trainer.step + 1 in INJECT_AT else g
    )
    result = trainer.train()
    skipped = {s for s, m in sink.metrics().items() if m["skipped"]}
    assert skipped == INJECT_AT
    warnings = _overflow_warnings(sink)
    assert set(warnings) == INJECT_AT
    for data in warnings.values():
        assert data["param"] == "blocks.1.weight" and data["norm"] == "inf"
        assert "blocks.1.weight" in data["message"]
    assert result.overflow_counts == {"blocks.1.weight": 2}


def test_an_overflow_in_one_layers_backward_names_that_layer_not_the_ones_before_it() -> None:
    # The gradient of blocks.1's output becomes NaN: blocks.1's and blocks.0's parameters
    # all get non-finite gradients, blocks.2's stay finite. The first in backward order is
    # blocks.1's (its bias: registered after its weight, so produced "first" by the proxy).
    sink = ListSink()
    trainer = _trainer(sink)
    layer = trainer.model.blocks[1]  # type: ignore[index,union-attr]

    def poison(_: nn.Module, __: Any, out: torch.Tensor) -> None:
        if trainer.step + 1 in INJECT_AT:
            out.register_hook(lambda g: g * math.nan)

    layer.register_forward_hook(poison)
    result = trainer.train()
    warnings = _overflow_warnings(sink)
    assert set(warnings) == INJECT_AT
    assert {d["param"] for d in warnings.values()} == {"blocks.1.bias"}
    assert {d["norm"] for d in warnings.values()} == {"nan"}
    assert result.overflow_counts == {"blocks.1.bias": 2}


def test_bf16_and_fp32_runs_have_no_attribution() -> None:
    result = Trainer(
        spec(precision="bf16", max_steps=2), RunContext(None, sink=ListSink()), components(Blocks)
    ).train()
    assert result.overflow_counts == {} and result.skipped_steps == 0


def test_the_window_codes_name_the_last_registered_non_finite_norm() -> None:
    inf, nan = math.inf, math.nan
    same = [torch.tensor(v) for v in ([1.0, inf, 2.0], [nan, 1.0, inf], [1.0, 2.0, 3.0])]
    assert [c.item() for c in first_nonfinite(same)] == [2.0, 4.0, -1.0]  # 2*i + isnan
    # Steps whose parameters differ (one had no gradient) are coded one by one.
    mixed = [torch.tensor([1.0, nan]), torch.tensor([inf, 1.0, 1.0])]
    assert [c.item() for c in first_nonfinite(mixed)] == [3.0, 0.0]
