"""A fork's first state: its parent's checkpoint (see :mod:`amptrain.contract.forks`).

The parent's checkpoint is read once, through the same checkpoint store as a resume (the
service's ``AMPTRAIN_CHECKPOINT_URL`` and the parent's id: never a user's path), and
loaded as a resume loads one, so a fork without overrides trains the parent's next steps
bit for bit. What differs is the optimizer (:meth:`RunState.load_fork`): the fork's own
hyper-parameters over the parent's state, or fresh state for another kind of optimizer.
The run then writes its own checkpoint of that step at once (later attempts resume from
their own copy) and releases the parent's pin.
"""

from __future__ import annotations

from typing import Any

from amptrain.contract.errors import ResumeMismatchError
from amptrain.contract.layout import checkpoint_name
from amptrain.engine.checkpoint import CheckpointStore
from amptrain.engine.checkpoint_manager import RunState
from amptrain.engine.context import ForkOrigin


def read_parent_checkpoint(origin: ForkOrigin) -> dict[str, Any]:
    """The parent's checkpoint; ``resume_mismatch`` (not retried) when it is gone."""
    store = CheckpointStore(origin.checkpoint_dir, writer=False)
    try:
        return store.load(store.path(checkpoint_name(origin.step)))
    except FileNotFoundError:
        raise ResumeMismatchError(
            f"cannot fork: job {origin.parent} has no checkpoint at step {origin.step} any "
            "more (removed with its job's files?); fork one of its remaining checkpoints",
            step=origin.step,
        ) from None


def start_from_parent(run: RunState, origin: ForkOrigin) -> dict[str, Any]:
    """Load the parent's checkpoint into ``run``; the ``forked`` event's data."""
    kept = run.load_fork(read_parent_checkpoint(origin))
    return {
        "from_job": origin.parent,
        "from_step": origin.step,
        "optimizer": "kept" if kept else "fresh",
    }


def release_pin(origin: ForkOrigin) -> None:
    """The fork holds its own copy of its first state: the parent may prune its checkpoint."""
    CheckpointStore(origin.checkpoint_dir, writer=False).release_pin(origin.step, origin.fork_id)
