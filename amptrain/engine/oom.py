"""Out-of-memory: recognising it, and the smaller micro-batch a step retries with."""

from __future__ import annotations

from typing import Any

import torch

from amptrain.contract.errors import OutOfMemoryError
from amptrain.contract.spec import JobSpec
from amptrain.engine.memory import format_bytes
from amptrain.engine.train_state import TrainState

ALLOCATION_FAILURES = (
    # The CPU allocator: "[enforce fail at alloc_cpu.cpp:...] ... DefaultCPUAllocator: can't
    # allocate memory: you tried to allocate N bytes".
    "can't allocate memory",
    # cuBLAS creating a handle or its workspace on a full GPU (TORCH_CUDABLAS_CHECK):
    # "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`".
    "CUBLAS_STATUS_ALLOC_FAILED",
    # cuDNN (AT_CUDNN_CHECK: "cuDNN error: <status>"): cuDNN 8 says CUDNN_STATUS_ALLOC_FAILED,
    # cuDNN 9 CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED.
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    # cuSOLVER, cuSPARSE and cuFFT on a full GPU (linear algebra, sparse ops, torch.fft).
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    # A CUDA runtime allocation outside PyTorch's caching allocator (C10_CUDA_CHECK of
    # cudaErrorMemoryAllocation): "CUDA error: out of memory".
    "CUDA error: out of memory",
)
"""Messages of allocation failures that reach Python as a plain RuntimeError. The caching
allocator's own failure is a torch.OutOfMemoryError; these come from the libraries under it
(each allocates for itself, often on the first step) and mean the same: memory ran out."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device (or the host) ran out of memory: a smaller micro-batch
    may fit. CUDA's caching allocator raises torch.OutOfMemoryError; the CPU allocator and
    the CUDA libraries a RuntimeError whose message names the failed allocation."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    message = str(exc)
    return isinstance(exc, RuntimeError) and any(m in message for m in ALLOCATION_FAILURES)


def smaller_micro_batch(spec: JobSpec, step: int, old: int, grad_accum: int, peak: int) -> int:
    """The micro-batch to retry ``step`` with after an OOM at micro-batch ``old``: the largest
    divisor of ``batch_size`` at most half of it (so micro x accumulation stays the batch).
    Raises OutOfMemoryError, naming the micro-batch and what to change, when the spec does
    not allow shrinking or it cannot shrink further."""
    smaller = _largest_divisor_at_most(spec.batch_size, old // 2)
    if spec.auto_micro_batch and spec.world_size == 1 and smaller >= 1:
        return smaller
    if spec.world_size > 1:
        # One rank cannot change its micro-batch alone: the others would wait on it.
        hint = "with devices or nodes > 1 the micro-batch cannot shrink: raise grad_accum_steps or lower batch_size"
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


def shrink(spec: JobSpec, state: TrainState, peak: int) -> dict[str, Any]:
    """Halve ``state``'s micro-batch for the step being retried (doubling accumulation), or
    raise OutOfMemoryError; the ``micro_batch`` event's data."""
    old = state.micro_batch
    state.micro_batch = smaller_micro_batch(spec, state.step + 1, old, state.grad_accum, peak)
    state.grad_accum = spec.batch_size // state.micro_batch
    return {
        "old": old,
        "new": state.micro_batch,
        "grad_accum_steps": state.grad_accum,
        "reason": f"out of memory at micro-batch {old} (peak {format_bytes(peak)})",
    }
