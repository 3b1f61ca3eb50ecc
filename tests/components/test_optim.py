"""Optimizers and schedules: fused kernels everywhere, fused SGD safe from a skipped first
step, and the learning-rate table the engine keeps on the device."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from amptrain.components import registry
from amptrain.components.optim import lr_factor
from amptrain.contract.spec import OptimizerSpec, ScheduleSpec

CPU = torch.device("cpu")


def test_optimizers_decay_only_matrices_and_are_fused() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    for name in ("adamw", "sgd"):
        opt = registry.build_optimizer(
            OptimizerSpec(name=name, weight_decay=0.1), net.parameters(), CPU
        )
        decayed = [g for g in opt.param_groups if g["weight_decay"] == 0.1]
        assert [p.shape for p in decayed[0]["params"]] == [torch.Size([4, 4])]
        assert sum(len(g["params"]) for g in opt.param_groups) == 4
        # Fused on the CPU too: GradScaler's skip and a tensor lr stay on the device.
        assert opt.defaults["fused"] is True and opt._step_supports_amp_scaling
    assert isinstance(
        registry.build_optimizer(OptimizerSpec(), net.parameters(), CPU), torch.optim.AdamW
    )


@pytest.mark.gpu
def test_optimizers_are_fused_on_cuda() -> None:
    net = torch.nn.Linear(4, 4).cuda()
    for name in ("adamw", "sgd"):
        opt = registry.build_optimizer(
            OptimizerSpec(name=name), net.parameters(), torch.device("cuda")
        )
        assert opt.defaults["fused"] is True


def _train_fp16(
    make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
) -> tuple[list[torch.Tensor], list[float]]:
    """Six AMP steps in the engine's order; step 1's gradients overflow, so it is skipped."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = make_optimizer(list(net.parameters()))
    for group in opt.param_groups:
        group["lr"] = torch.tensor(0.05)  # as the engine's device schedule sets it
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = torch.randn(8, 16), torch.randint(4, (8,))
    scales = []
    for step in range(1, 7):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            logits = net(x)
        scaler.scale(F.cross_entropy(logits.float(), y)).backward()
        if step == 1:
            net[0].weight.grad.fill_(math.inf)
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().clone() for p in net.parameters()], scales


def _engine_sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return registry.build_optimizer(
        OptimizerSpec(name="sgd", lr=0.05, weight_decay=1e-4), params, CPU
    )


def _unfused_sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 1e-4},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.SGD(groups, lr=0.05, momentum=0.9, foreach=False)


def test_fused_sgd_after_a_skipped_first_step_matches_unfused_sgd_bitwise() -> None:
    (fused, scales), (reference, _) = _train_fp16(_engine_sgd), _train_fp16(_unfused_sgd)
    assert scales == [512.0] * 6  # step 1 overflowed and was skipped; no other step did
    assert all(torch.isfinite(p).all() for p in fused)
    assert all(torch.equal(a, b) for a, b in zip(fused, reference, strict=True))


def test_the_fix_is_what_keeps_uninitialised_momentum_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # Uninitialised memory made visible: every empty_like is NaN. Plain fused SGD creates its
    # momentum that way on its first step, whose kernel the skip then returns from early.
    monkeypatch.setattr(torch, "empty_like", lambda t, *a, **k: torch.full_like(t, math.nan))

    def plain_fused(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=True)

    assert not all(torch.isfinite(p).all() for p in _train_fp16(plain_fused)[0])
    (fixed, _), (reference, _) = _train_fp16(_engine_sgd), _train_fp16(_unfused_sgd)
    assert all(torch.equal(a, b) for a, b in zip(fixed, reference, strict=True))


def test_schedules_warm_up_then_decay() -> None:
    cos = lr_factor(ScheduleSpec(name="cosine", warmup_steps=4, min_lr_ratio=0.1), 14)
    assert [cos(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert (
        cos(9) == pytest.approx(0.55)
        and cos(14) == pytest.approx(0.1)
        and cos(100) == pytest.approx(0.1)
    )
    lin = lr_factor(ScheduleSpec(name="linear", min_lr_ratio=0.0), 10)
    assert [lin(s) for s in (0, 5, 10)] == [1.0, 0.5, 0.0]
    const = lr_factor(ScheduleSpec(name="constant", warmup_steps=2), 10)
    assert [const(s) for s in (0, 1, 5)] == [0.5, 1.0, 1.0]


@pytest.mark.parametrize(
    "spec",
    [
        ScheduleSpec(name="cosine", warmup_steps=4, min_lr_ratio=0.1),
        ScheduleSpec(name="linear", warmup_steps=0),
        ScheduleSpec(name="constant", warmup_steps=3),
        ScheduleSpec(name="cosine", warmup_steps=50),  # warm-up longer than the run
    ],
)
def test_the_lr_table_holds_the_schedule_for_every_applied_step(spec: ScheduleSpec) -> None:
    table = registry.lr_table(spec, 3e-4, 20)
    factor = lr_factor(spec, 20)
    assert table.dtype == torch.float32 and table.shape == (21,)
    expected = torch.tensor([3e-4 * factor(s) for s in range(21)], dtype=torch.float64)
    torch.testing.assert_close(table.double(), expected, rtol=1e-6, atol=0.0)
