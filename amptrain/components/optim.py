"""Optimizers and learning-rate schedules built from the job spec."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from amptrain.contract.spec import OptimizerSpec, ScheduleSpec


def _param_groups(
    params: Iterable[torch.nn.Parameter], weight_decay: float
) -> list[dict[str, object]]:
    # Decay matrices and kernels only: decaying biases and norm gains hurts and is not standard.
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups: list[dict[str, object]] = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(
    spec: OptimizerSpec, params: Iterable[torch.nn.Parameter], device: torch.device
) -> torch.optim.Optimizer:
    """AdamW or SGD, fused on the CPU and on CUDA alike.

    Fused kernels take GradScaler's inf flag and a tensor learning rate on the device,
    so an fp16 step that overflows is skipped without the host ever reading the flag,
    and the schedule can live on the device (``amptrain.engine.lr_schedule``).
    SGD's momentum buffers are created zeroed here: fused SGD would otherwise allocate
    them with ``empty_like`` on its first step, and when the scaler skips that step its
    kernel returns early, leaving uninitialised memory that the next step reads as
    momentum. Zero buffers give exactly the unfused first step (``buf = grad``).
    """
    del device  # the parameters are already on it; fused kernels exist for CPU and CUDA
    groups = _param_groups(params, spec.weight_decay)
    if spec.name == "adamw":
        return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, fused=True)
    sgd = torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum, fused=True)
    zero_momentum(sgd)
    return sgd


def zero_momentum(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of a momentum SGD a zeroed momentum buffer (see build_optimizer)."""
    for group in optimizer.param_groups:
        if not group.get("momentum"):
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def lr_factor(spec: ScheduleSpec, max_steps: int) -> Callable[[int], float]:
    """The multiplier of the peak learning rate for each optimizer step (0-based)."""
    warmup = spec.warmup_steps
    floor = spec.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup  # the first step already moves, at lr / warmup
        if spec.name == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        if spec.name == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1 - (1 - floor) * progress

    return factor


def lr_table(spec: ScheduleSpec, peak_lr: float, max_steps: int) -> torch.Tensor:
    """The learning rate after ``n`` applied optimizer steps, for n = 0..max_steps (float32, CPU).

    Linear warm-up then cosine, linear or constant, as :func:`lr_factor` defines it,
    computed for every step at once in float64. The engine keeps this table on the
    training device and indexes it with a device-side count of applied steps, so the
    schedule needs no host read. 4 bytes per step: a million steps take 4 MiB.
    """
    steps = torch.arange(max_steps + 1, dtype=torch.float64)
    warmup, floor = spec.warmup_steps, spec.min_lr_ratio
    progress = ((steps - warmup) / max(1, max_steps - warmup)).clamp(0.0, 1.0)
    if spec.name == "constant":
        decay = torch.ones_like(steps)
    elif spec.name == "cosine":
        decay = floor + (1 - floor) * 0.5 * (1 + torch.cos(math.pi * progress))
    else:
        decay = 1 - (1 - floor) * progress
    factor = torch.where(steps < warmup, (steps + 1) / max(1, warmup), decay)
    return (peak_lr * factor).to(torch.float32)
