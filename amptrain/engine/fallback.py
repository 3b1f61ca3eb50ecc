"""Precision fallback (``health.fallback``): where an unhealthy fp16 run goes, and what
its attempt leaves behind for the next one.

The health checks (:class:`~amptrain.engine.health.HealthMonitor`) raise a
:class:`~amptrain.contract.errors.PrecisionFallbackError` at the flush that sees a trigger.
The attempt then removes every checkpoint after the newest *healthy* one (each checkpoint
records whether a trigger was building when it was written), so the next attempt's
ordinary resume takes that one, or starts afresh when there is none; the worker re-queues
the job with the new precision (``jobs.precision_override``) without charging its retry
budget. The job keeps one series: the next attempt re-records every step after the
checkpoint, and a job's series is, per step, its newest attempt's point.
"""

from __future__ import annotations

from typing import Any

import torch

from amptrain.contract.errors import PrecisionFallbackError
from amptrain.contract.layout import checkpoint_name
from amptrain.contract.spec import JobSpec
from amptrain.engine.checkpoint import CheckpointStore
from amptrain.engine.precision import PrecisionChoice


def fallback_target(spec: JobSpec, precision: PrecisionChoice, device: torch.device) -> str | None:
    """The precision this run falls back to when fp16 becomes unhealthy; None: it fails.

    Null ``health.fallback`` means ``auto`` when ``precision: auto`` chose fp16, ``none``
    for an explicit fp16. ``bf16`` and ``auto`` need a device with native bf16 (a CUDA GPU
    of capability >= 8.0, or a CPU, where bf16 autocast always runs); elsewhere they fall
    back to fp32, which every device has."""
    if precision.effective != "fp16":
        return None
    policy = spec.health.fallback or ("auto" if spec.precision == "auto" else "none")
    if policy == "none":
        return None
    if policy == "fp32" or not _native_bf16(device):
        return "fp32"
    return "bf16"


def _native_bf16(device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def newest_healthy(store: CheckpointStore, step: int) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint at or before ``step`` written while training was healthy (what
    a precision fallback and a spike rollback go back to): its step and state; None: none."""
    for found in reversed(store.steps()):
        if found > step:
            continue
        state = store.load(store.path(checkpoint_name(found)))
        if state.get("healthy", False):
            return found, state
    return None


def leave_fp16(store: CheckpointStore | None, error: PrecisionFallbackError) -> dict[str, Any]:
    """Remove the checkpoints after the newest healthy one (the next attempt resumes from it,
    or from the start); the ``precision_fallback`` event's data."""
    found = newest_healthy(store, error.step or 0) if store is not None else None
    healthy = found[0] if found is not None else None
    if store is not None:
        store.discard_after(healthy or 0)
    return {
        "trigger": error.trigger,
        "trigger_step": error.step,
        "from": "fp16",
        "to": error.to,
        "resume_from": healthy or 0,
        "checkpoint": checkpoint_name(healthy) if healthy is not None else None,
        "param": error.param,
        "message": error.message
        + (f" (step {healthy})" if healthy is not None else "; there is none, so from the start"),
    }
