"""Optimizers and learning-rate schedules built from the job spec."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainer_core.contract.spec import OptimizerSpec, ScheduleSpec


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
    """AdamW or SGD. On CUDA both are fused: the optimizer step reads GradScaler's inf flag on
    the device, so fp16 training needs no per-step host sync."""
    groups = _param_groups(params, spec.weight_decay)
    fused = device.type == "cuda"
    if spec.name == "adamw":
        return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, fused=fused or None)
    return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum, fused=fused or None)


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


def build_schedule(
    spec: ScheduleSpec, optimizer: torch.optim.Optimizer, max_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warm-up then cosine, linear or constant, as a ``LambdaLR`` (checkpointable)."""
    return LambdaLR(optimizer, lr_factor(spec, max_steps))
