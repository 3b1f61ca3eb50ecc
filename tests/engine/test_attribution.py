"""Overflow attribution: a skipped fp16 step's warning names the parameter whose gradient
overflowed first (in backward order), and the run counts the offenders."""

from __future__ import annotations

import math
from typing import Any

import pytest
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


class FirstBackward:
    """Notes the order the run's first backward accumulates its gradients in, with hooks of
    the test's own (the kind the engine records with), on until :meth:`done`."""

    def __init__(self, trainer: Trainer) -> None:
        self._produced: list[tuple[int, str]] = []
        self._handles = [
            p.register_post_accumulate_grad_hook(
                lambda _, n=n: self._produced.append((trainer.step, n))
            )
            for n, p in trainer.model.named_parameters()
        ]

    def done(self) -> list[str]:
        for handle in self._handles:
            handle.remove()
        return [n for step, n in self._produced if step == 0]


def _poison_output(trainer: Trainer, layer: nn.Module) -> None:
    """At the INJECT_AT steps the gradient of ``layer``'s output becomes NaN: its own
    parameters' and those of every layer before it in the forward get non-finite gradients,
    the ones after it stay finite."""

    def poison(_: nn.Module, __: Any, out: torch.Tensor) -> None:
        if trainer.step + 1 in INJECT_AT:
            out.register_hook(lambda g: g * math.nan)

    layer.register_forward_hook(poison)


def test_an_overflow_in_one_layers_backward_names_that_layer_not_the_ones_before_it() -> None:
    sink = ListSink()
    trainer = _trainer(sink)
    noted = FirstBackward(trainer)
    _poison_output(trainer, trainer.model.blocks[1])  # type: ignore[index,union-attr]
    result = trainer.train()
    order = noted.done()
    # Of blocks.1's two parameters, whichever autograd accumulated first (under fp16
    # autocast each gradient comes through its cast's backward: here the weight's).
    first = next(n for n in order if n.startswith("blocks.1."))
    warnings = _overflow_warnings(sink)
    assert set(warnings) == INJECT_AT
    assert {d["param"] for d in warnings.values()} == {first}
    assert {d["norm"] for d in warnings.values()} == {"nan"}
    assert result.overflow_counts == {first: 2}


class Reversed(nn.Module):
    """Registered ``head``, ``mid``, ``stem``, ``extra``; the forward runs stem -> extra ->
    mid -> head: registration order is not the order of use, so neither it nor its reverse
    is backward order. ``extra`` (a residual layer) sits out the steps ``idle_at``: they
    have no gradient for it."""

    def __init__(self, idle_at: set[int]) -> None:
        super().__init__()
        self.head, self.mid = nn.Linear(16, 4), nn.Linear(16, 16)
        self.stem, self.extra = nn.Linear(8, 16), nn.Linear(16, 16)
        self.idle_at = idle_at
        self.trainer: Trainer | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.stem(x))
        if self.trainer is None or self.trainer.step + 1 not in self.idle_at:
            h = h + self.extra(h)
        return self.head(F.gelu(self.mid(h)))


@pytest.mark.parametrize("idle", [False, True], ids=["all-gradients", "one-layer-idle"])
def test_backward_order_is_recorded_not_taken_from_registration(idle: bool) -> None:
    """An inf born in ``mid``'s backward reaches ``extra``'s and ``stem``'s gradients too;
    the first of them in backward order is one of ``mid``'s. Reverse registration order
    (the proxy this replaced) named the last registered of them: ``extra.bias``, or
    ``stem.bias`` on the steps ``extra`` sits out."""
    sink = ListSink()
    trainer = Trainer(
        spec(precision="fp16", max_steps=6, loss_scale={"init_scale": 256}),
        RunContext(None, sink=sink),
        components(lambda: Reversed(INJECT_AT if idle else set())),
    )
    model = trainer.model
    assert isinstance(model, Reversed)
    model.trainer = trainer
    noted = FirstBackward(trainer)
    _poison_output(trainer, model.mid)
    result = trainer.train()
    order = noted.done()
    assert [n.split(".")[0] for n in order[::2]] == ["head", "mid", "extra", "stem"]
    first = next(n for n in order if n.startswith("mid."))
    warnings = _overflow_warnings(sink)
    assert {s: d["param"] for s, d in warnings.items()} == dict.fromkeys(INJECT_AT, first)
    assert result.overflow_counts == {first: 2}
    # The engine's hooks went after the first backward: only the test's were left, now gone.
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())


def test_bf16_and_fp32_runs_have_no_attribution() -> None:
    result = Trainer(
        spec(precision="bf16", max_steps=2), RunContext(None, sink=ListSink()), components(Blocks)
    ).train()
    assert result.overflow_counts == {} and result.skipped_steps == 0


def test_the_window_codes_name_the_non_finite_norm_of_highest_priority() -> None:
    inf, nan = math.inf, math.nan
    # Backward produced parameter 1's gradient first, then 2's, then 0's.
    priority = torch.tensor([0.0, 2.0, 1.0])
    same = [
        torch.tensor(v)
        for v in ([1.0, inf, 2.0], [nan, 1.0, inf], [1.0, 2.0, 3.0], [nan, 1.0, 1.0])
    ]
    codes = first_nonfinite(same, [priority] * len(same))
    assert [c.item() for c in codes] == [4.0, 2.0, -1.0, 1.0]  # 2 * priority + isnan
    # Steps as wide but with other parameters (and priorities) are stacked, each its own.
    other = torch.tensor([2.0, 0.0, 1.0])
    codes = first_nonfinite(same[:2], [priority, other])
    assert [c.item() for c in codes] == [4.0, 5.0]
    # Steps whose parameters differ in number (one had no gradient) are coded one by one.
    mixed = [torch.tensor([1.0, nan]), torch.tensor([inf, 1.0, 1.0])]
    codes = first_nonfinite(mixed, [torch.tensor([2.0, 0.0]), priority])
    assert [c.item() for c in codes] == [1.0, 0.0]
