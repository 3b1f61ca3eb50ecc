"""Out-of-memory: recognising it, and the smaller micro-batch a step retries with."""

from __future__ import annotations

import torch

from amptrain.contract.errors import OutOfMemoryError
from amptrain.contract.spec import JobSpec
from amptrain.engine.memory import format_bytes


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA raises torch.OutOfMemoryError; the CPU allocator a plain RuntimeError."""
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)


def smaller_micro_batch(spec: JobSpec, step: int, old: int, grad_accum: int, peak: int) -> int:
    """The micro-batch to retry ``step`` with after an OOM at micro-batch ``old``: the largest
    divisor of ``batch_size`` at most half of it (so micro x accumulation stays the batch).
    Raises OutOfMemoryError, naming the micro-batch and what to change, when the spec does
    not allow shrinking or it cannot shrink further."""
    smaller = _largest_divisor_at_most(spec.batch_size, old // 2)
    if spec.auto_micro_batch and spec.devices == 1 and smaller >= 1:
        return smaller
    if spec.devices > 1:
        # One rank cannot change its micro-batch alone: the others would wait on it.
        hint = "with devices > 1 the micro-batch cannot shrink: raise grad_accum_steps or lower batch_size"
    elif spec.auto_micro_batch:
        hint = "the micro-batch cannot shrink below 1"
    else:
        hint = "set auto_micro_batch: true, raise grad_accum_steps or lower batch_size"
    raise OutOfMemoryError(
        f"out of memory at step {step} with micro-batch {old} "
        f"(batch_size {spec.batch_size} = {old} x {grad_accum} accumulation steps"
        f"{f' x {spec.devices} devices' if spec.devices > 1 else ''}; "
        f"peak memory {format_bytes(peak)}): {hint}",
        step=step,
    ) from None


def _largest_divisor_at_most(n: int, limit: int) -> int:
    """Largest d <= limit dividing n (0 when limit < 1)."""
    for d in range(limit, 0, -1):
        if n % d == 0:
            return d
    return 0
