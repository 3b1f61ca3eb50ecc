"""Will the job fit the device? Estimated before the model is built for real.

A spec can ask for a model a thousand times larger than any GPU; building it
would take the worker's memory (or its swap) with it. So the model is first built
on PyTorch's ``meta`` device, which records shapes and allocates nothing: its
parameter count is exact, and one forward pass there, with autograd's
saved-tensor hooks counting what backward would keep, estimates the activations
of one micro-batch. Together with fp32 gradients and the optimizer's state that is
compared with the device's memory; a job that cannot fit fails at once with
``too_large`` (not retried: another attempt would not fit either).

The estimate is rough on purpose and errs low (no allocator fragmentation, no
temporaries of the backward pass), so it refuses only jobs that cannot fit. On a CPU it is
compared with what the process can still allocate once its dataset is built (the dataset
itself was checked against the same before it was built, see
:func:`amptrain.components.registry.build_dataset`). An estimate that fits may still run
out of memory later, which is ``oom``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from amptrain.components.base import DataInfo
from amptrain.contract import host_memory, sizing
from amptrain.contract.errors import InvalidSpecError, TooLargeError
from amptrain.contract.spec import JobSpec
from amptrain.engine.sharding import LOW_PRECISION_PARAMS, blocks

log = logging.getLogger(__name__)

_LOW_PRECISION = ("fp16", "bf16")


@dataclass(frozen=True)
class FitEstimate:
    parameters: int
    state_bytes: int
    """fp32 weights + gradients + optimizer state on one device (fsdp: its shard, and the
    largest unit gathered whole)."""
    activation_bytes: int
    micro_batch: int

    @property
    def total(self) -> int:
        return self.state_bytes + self.activation_bytes


def estimate(spec: JobSpec, info: DataInfo, precision: str) -> FitEstimate | None:
    """The job's device memory, roughly; None when the model cannot be built on ``meta``
    (a plugin that reads data or calls ``.item()`` while it is built)."""
    from amptrain.components import registry

    try:
        with torch.device("meta"):
            model = registry.build_model(spec.model, info)
    except InvalidSpecError:
        raise
    except Exception as exc:  # not a user error: the real build will tell
        log.info(
            "memory estimate skipped: %s cannot be built on the meta device: %r",
            spec.model.name,
            exc,
        )
        return None
    parameters = sum(p.numel() for p in model.parameters())
    state = sizing.training_state_bytes(parameters, spec.optimizer.name, spec.optimizer.momentum)
    gathered = _gathered_bytes(model, parameters, precision) if spec.parallelism == "fsdp" else 0
    state = sizing.per_device_state_bytes(state, spec.devices, spec.parallelism, gathered)
    # With auto_micro_batch the engine halves the micro-batch on OOM, down to 1.
    micro = 1 if spec.auto_micro_batch else spec.micro_batch_size
    activations = _activation_bytes(model, info, micro, precision)
    return FitEstimate(parameters, state, activations or 0, micro)


def _gathered_bytes(model: torch.nn.Module, parameters: int, precision: str) -> int:
    """What fsdp gathers whole at once, at most: the largest block, or the root's own
    parameters (everything outside the blocks), in the dtype the policy gathers them in."""
    units = [sum(p.numel() for p in b.parameters()) for b in blocks(model)]
    dtype = LOW_PRECISION_PARAMS.get(precision, torch.float32)
    return max([parameters - sum(units), *units]) * dtype.itemsize


def _activation_bytes(
    model: torch.nn.Module, info: DataInfo, micro: int, precision: str
) -> int | None:
    """What autograd saves for backward in one forward pass of ``micro`` samples."""
    params = {id(p) for p in model.parameters()}
    saved: dict[int, int] = {}
    shrink = 0.5 if precision in _LOW_PRECISION else 1.0  # autocast keeps most of it in 16 bit

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in params and id(t) not in params:
            factor = shrink if base.is_floating_point() and base.element_size() == 4 else 1.0
            saved[id(base)] = int(base.numel() * base.element_size() * factor)
        return t

    dtype = torch.long if info.token_inputs else torch.float32
    inputs = torch.zeros((micro, *info.input_shape), dtype=dtype, device="meta")
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model.train()(inputs)
    except Exception as exc:
        log.info("activation estimate skipped: forward on the meta device failed: %r", exc)
        return None
    # The loss keeps about the logits' size again (log-softmax) for backward.
    return sum(saved.values()) + 2 * math.prod(logits.shape) * 4


def device_memory(device: torch.device) -> int | None:
    """Bytes the job may still take on the device: a GPU's total memory, or on a CPU what
    this process can still allocate (the dataset, built just before, is already out of it;
    :mod:`amptrain.contract.host_memory`: cgroup limits and what other processes hold)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type != "cpu":
        return None
    return host_memory.available()


def check_fits(spec: JobSpec, info: DataInfo, device: torch.device, precision: str) -> None:
    """Raise :class:`TooLargeError` when the estimate exceeds the device's memory."""
    found = estimate(spec, info, precision)
    capacity = device_memory(device)
    if found is None or capacity is None:
        return
    if device.type == "cpu":
        capacity //= spec.devices  # data-parallel ranks on a CPU share the machine's RAM
    log.info(
        "memory estimate: %d parameters, %s state + %s activations (micro-batch %d) on %s (%s)",
        found.parameters,
        sizing.format_bytes(found.state_bytes),
        sizing.format_bytes(found.activation_bytes),
        found.micro_batch,
        device,
        sizing.format_bytes(capacity),
    )
    if found.total <= capacity:
        return
    if device.type == "cuda":
        where = f"the GPU has {sizing.format_bytes(capacity)}"
    else:
        per = f" per process ({spec.devices} processes)" if spec.devices > 1 else ""
        where = f"the training process has {sizing.format_bytes(capacity)} available here{per}"
    shard = f" (this device's fsdp shard of {spec.devices})" if spec.parallelism == "fsdp" else ""
    raise TooLargeError(
        f"too large for this worker: the job needs about {sizing.format_bytes(found.total)} "
        f"({found.parameters:,} parameters: {sizing.format_bytes(found.state_bytes)} for "
        f"weights, gradients and {spec.optimizer.name} state{shard}; about "
        f"{sizing.format_bytes(found.activation_bytes)} of activations for a micro-batch of "
        f"{found.micro_batch}), but {where}. Make the model smaller, or the micro-batch "
        f"(raise grad_accum_steps or set auto_micro_batch){_shard_hint(spec)}"
    )


def _shard_hint(spec: JobSpec) -> str:
    if spec.devices > 1 and spec.parallelism == "ddp":
        return f", or shard the model state across the {spec.devices} devices (parallelism: fsdp)"
    return ""
