"""Precision fallback (``health.fallback``): where an unhealthy fp16 run goes, and what
its attempt leaves behind for the next one.

The guardian (:class:`~amptrain.engine.guardian.Guardian`) returns a
:class:`~amptrain.engine.guardian.FallBack` verdict on the flush that reads a trigger. The
Trainer then removes every checkpoint after the newest *healthy* one at or before the
trigger (each checkpoint's sidecar says whether a trigger was building when it was written),
so the next attempt's ordinary resume takes that one, or starts afresh when there is none,
and ends the attempt with a :class:`~amptrain.contract.errors.PrecisionFallbackError`; the worker re-queues
the job with the new precision (``jobs.precision_override``) without charging its retry
budget. The job keeps one series: the next attempt re-records every step after the
checkpoint, and a job's series is, per step, its newest attempt's point.
"""

from __future__ import annotations

from typing import Any

import torch

from amptrain.contract.layout import checkpoint_name
from amptrain.contract.spec import JobSpec
from amptrain.engine.guardian import FallBack
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


def fallback_event(verdict: FallBack, resume_from: int | None) -> dict[str, Any]:
    """The ``precision_fallback`` event's data: what triggered it, where the next attempt
    resumes (``resume_from``: the newest healthy checkpoint at or before the trigger, the
    checkpoints after it removed; None: there is none, so from the start)."""
    return {
        "trigger": verdict.trigger,
        "trigger_step": verdict.step,
        "from": "fp16",
        "to": verdict.fallback_to,
        "resume_from": resume_from or 0,
        "checkpoint": checkpoint_name(resume_from) if resume_from is not None else None,
        "param": verdict.param,
        "message": verdict.message
        + (
            f" (step {resume_from})"
            if resume_from is not None
            else "; there is none, so from the start"
        ),
    }
