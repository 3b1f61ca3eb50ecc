"""Where a job's checkpoints live and how they are named.

Torch-free: the engine writes by these names, the worker points each attempt
at its job's directory, and the API lists and serves the files.
"""

from __future__ import annotations

import re

from amptrain.contract.job_ids import JOB_ID

_NAME = re.compile(r"^step-(\d{9})\.pt$")

STEP_TEXT = r"^(0|[1-9][0-9]{0,8})$"
"""A checkpoint's step as a URL names it: a plain decimal integer of at most the nine digits
a checkpoint name holds, no sign, space, leading zero, decimal point or underscore."""


def checkpoint_name(step: int) -> str:
    """``step-000000500.pt``: lexical order is step order."""
    return f"step-{step:09d}.pt"


def weights_name(step: int) -> str:
    """``step-000000500.safetensors``: the model's weights of that checkpoint alone, as
    safetensors (library names), written beside it for export and download."""
    return checkpoint_name(step).removesuffix(".pt") + ".safetensors"


def shards_name(step: int) -> str:
    """``step-000000500.dcp``: with ``parallelism: fsdp``, the sharded model and optimizer
    state of that checkpoint, a PyTorch Distributed Checkpoint directory every rank wrote its
    shards into (the ``.pt`` file beside it holds the rest, and is written last)."""
    return checkpoint_name(step).removesuffix(".pt") + ".dcp"


def checkpoint_step(name: str) -> int | None:
    """The step a checkpoint file name stands for; None for anything else (temporaries)."""
    match = _NAME.match(name.rsplit("/", 1)[-1])
    return int(match[1]) if match else None


def job_checkpoint_url(base: str, job_id: str) -> str:
    """A job's checkpoint directory under the service's checkpoint root (path or fsspec URL)."""
    return f"{base.rstrip('/')}/{job_id}"


_PIN = re.compile(rf"^step-(\d{{9}})\.pin-{JOB_ID.pattern}$")


def pin_name(step: int, fork_id: str) -> str:
    """``step-000000500.pin-<fork id>``: a marker beside a checkpoint saying a fork starts
    from it, so the writer's ``keep_last`` pruning keeps it (see
    :mod:`amptrain.contract.forks`). One per fork: two forks of one step release their own."""
    if not JOB_ID.fullmatch(fork_id):  # a name in a shared directory: never a user string
        raise ValueError(f"not a job id: {fork_id[:40]!r}")
    return f"step-{step:09d}.pin-{fork_id}"


def pinned_step(name: str) -> int | None:
    """The step a pin file name protects; None for anything else."""
    match = _PIN.match(name.rsplit("/", 1)[-1])
    return int(match[1]) if match else None
