"""Data-parallel training (DDP): the process group, and the few collectives the engine runs.

One process per device, started by ``torch.distributed.run`` (torchrun), which tells
each its place in ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous in
``MASTER_ADDR``/``MASTER_PORT``. :meth:`Ranks.from_env` reads them from a mapping its
caller passes; :data:`NCCL_DEFAULTS` are the failure settings a launcher gives each rank
(the engine itself reads and writes no environment).

The rule that keeps ranks from deadlocking or drifting apart: every collective and
every control decision depends only on values equal on all ranks, taken at points
every rank reaches in the same order (step counts, never clocks). So with devices > 1:
gradients are all-reduced before ``unscale_`` (every rank skips the same fp16 steps);
telemetry flushes only every ``flush_every_steps`` and reduces each flush's values in
ONE all-gather (loss mean, memory max, the stop flag's max); health checks read the
reduced values; a stop request on any rank stops all ranks at the same flush; an
evaluation first broadcasts rank 0's buffers (every rank evaluates the same model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import JobSpec

NCCL_DEFAULTS = {
    # A collective that times out aborts the communicator and ends the process, instead
    # of leaving it blocked forever (the launcher then stops the others).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # On a timeout, each rank dumps its recent collectives (the flight recorder), which
    # names the rank and the collective that hung.
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
}
"""What a launcher sets for each rank before its process group exists (ProcessGroupNCCL
reads them when it is built), unless already set."""


STOP_CODES = {None: 0.0, "preempt": 1.0, "cancel": 2.0}
"""A stop request as a number, so ranks agree by MAX: a cancel anywhere wins over a preempt."""
_STOP_NAMES = {code: name for name, code in STOP_CODES.items()}


@dataclass(frozen=True)
class Ranks:
    """This process's place in a data-parallel run."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Ranks | None:
        """The place torchrun gave this process; None when it was not started by torchrun."""
        if "WORLD_SIZE" not in env:
            return None
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
        )


class Group:
    """The data-parallel group of one run; ``world_size`` 1 is a single process (no group)."""

    def __init__(self, ranks: Ranks | None, device: torch.device) -> None:
        self.rank = ranks.rank if ranks else 0
        self.world_size = ranks.world_size if ranks else 1
        self.local_rank = ranks.local_rank if ranks else 0
        self.device = device
        self._owned = False

    @property
    def parallel(self) -> bool:
        return self.world_size > 1

    @property
    def leader(self) -> bool:
        """Rank 0: the one rank that publishes telemetry and writes checkpoints."""
        return self.rank == 0

    def start(self, timeout_s: float) -> None:
        """Join the process group (NCCL on CUDA, gloo on a CPU); no-op for one process."""
        if not self.parallel or dist.is_initialized():
            return
        options: dict[str, Any] = {}
        if self.device.type == "cuda":
            options["device_id"] = self.device  # binds the group to this rank's GPU, eagerly
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
            **options,
        )
        self._owned = True

    def close(self) -> None:
        """Leave the group this object joined (at the end of the run, success or not)."""
        if self._owned and dist.is_initialized():
            dist.destroy_process_group()
        self._owned = False

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as DDP sees it (gradients all-reduced in the backward of the last
        micro-batch); the model itself when there is one process."""
        if not self.parallel:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def gather_rows(self, row: torch.Tensor) -> torch.Tensor:
        """Every rank's ``row`` (1-D, same length everywhere), stacked in rank order."""
        if not self.parallel:
            return row.unsqueeze(0)
        rows = [torch.empty_like(row) for _ in range(self.world_size)]
        dist.all_gather(rows, row)
        return torch.stack(rows)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over every rank, in place (itself when there is one process)."""
        if self.parallel:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order."""
        if not self.parallel:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def leader_value(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.parallel:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def share_leader_buffers(self, module: torch.nn.Module) -> None:
        """Overwrite ``module``'s buffers (BatchNorm running statistics, ...) with rank 0's,
        in ONE broadcast; nothing for one process or a module without buffers."""
        if not self.parallel:
            return
        buffers = list(module.buffers())
        if not buffers:
            return
        with torch.no_grad():
            # As bytes: buffers of any dtypes mix (float statistics, int64 batch counts).
            flat = torch.cat([b.reshape(-1).view(torch.uint8) for b in buffers])
            dist.broadcast(flat, src=0)
            if self.leader:
                return
            offset = 0
            for b in buffers:
                size = b.numel() * b.element_size()
                # A copy starts at offset 0: viewing bytes as a wider dtype needs alignment.
                b.copy_(flat[offset : offset + size].clone().view(b.dtype).view(b.shape))
                offset += size

    def barrier(self) -> None:
        if self.parallel:
            dist.barrier(device_ids=[self.local_rank] if self.device.type == "cuda" else None)

    def describe(self, device_name: str, parallelism: str = "ddp") -> str:
        """``device_name`` with the data-parallel layout, e.g. ``cuda (H100, ...) x 4 (DDP,
        NCCL 2.21.5)``; ``parallelism``: the spec's (``FSDP`` when sharded)."""
        kind = parallelism.upper()
        if not self.parallel:
            return device_name
        if self.device.type == "cuda":
            found = torch.cuda.nccl.version()  # a tuple; an int in older builds
            version = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
            return f"{device_name} x {self.world_size} ({kind}, NCCL {version})"
        return f"{device_name} x {self.world_size} ({kind}, gloo)"


def stop_name(code: float) -> str | None:
    """Inverse of :data:`STOP_CODES`."""
    return _STOP_NAMES.get(code)


def rank_device(spec_device: torch.device, ranks: Ranks | None) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` for a CUDA group (made current), else as given."""
    if spec_device.type != "cuda" or ranks is None or ranks.world_size == 1:
        return spec_device
    count = torch.cuda.device_count()
    if ranks.local_rank >= count:
        raise InvalidSpecError(
            f"devices: process {ranks.local_rank} of {ranks.world_size} on this machine has no "
            f"GPU of its own (the machine has {count})"
        )
    device = torch.device("cuda", ranks.local_rank)
    torch.cuda.set_device(device)
    return device


def check_launch(spec: JobSpec, ranks: Ranks | None) -> None:
    """The spec's ``nodes`` x ``devices`` must be the number of processes actually started."""
    started = ranks.world_size if ranks else 1
    if started == spec.world_size:
        return
    if spec.nodes > 1:
        raise InvalidSpecError(
            f"nodes: the spec asks for {spec.nodes} nodes x {spec.devices} device(s) = "
            f"{spec.world_size} data-parallel processes but {started} were started"
        )
    how = (
        f"launch it with `python -m torch.distributed.run --standalone --nproc-per-node "
        f"{spec.devices} -m amptrain.cli.train SPEC`"
        if spec.devices > 1
        else "set devices to the number of processes started"
    )
    raise InvalidSpecError(
        f"devices: the spec asks for {spec.devices} data-parallel process(es) but "
        f"{started} were started; {how}"
    )
