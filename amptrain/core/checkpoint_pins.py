"""Pins: markers beside a job's checkpoint that keep it from ``keep_last`` pruning while a
fork depends on it (names: :func:`amptrain.contract.layout.pin_name`).

The training process that prunes has no SQL, so the promise lives where the checkpoint
does, in the checkpoint store (``AMPTRAIN_CHECKPOINT_URL``, through fsspec): the API pins
before it checks that the checkpoint exists (a prune that comes after sees the pin), the
fork's training process releases the pin once its own first checkpoint (a copy of the
parent's state) is written, and the API or the worker releases it when the fork ends
without getting that far. Every path is built from the service's root and job ids, never
from a user's text.
"""

from __future__ import annotations

import contextlib
import logging

import fsspec

from amptrain.contract.layout import checkpoint_step, job_checkpoint_url, pin_name

log = logging.getLogger(__name__)


class CheckpointPins:
    """One job's checkpoint directory as forks see it: which checkpoints there are, and
    the pins beside them."""

    def __init__(self, base: str, job_id: str) -> None:
        self._fs, self._root = fsspec.core.url_to_fs(job_checkpoint_url(base, job_id))

    def steps(self) -> list[int]:
        """The complete checkpoints there are, oldest first."""
        if not self._fs.exists(self._root):
            return []
        names = self._fs.ls(self._root, detail=False)
        return sorted(s for n in names if (s := checkpoint_step(str(n))) is not None)

    def pin(self, step: int, fork_id: str) -> None:
        self._fs.makedirs(self._root, exist_ok=True)
        self._fs.pipe(f"{self._root}/{pin_name(step, fork_id)}", b"")

    def release(self, step: int, fork_id: str) -> None:
        """Remove the fork's pin (none there: nothing to do). Never raises: a pin left
        behind costs one checkpoint's space, never a job."""
        path = f"{self._root}/{pin_name(step, fork_id)}"
        try:
            with contextlib.suppress(FileNotFoundError):
                self._fs.rm(path)
        except OSError as exc:
            log.warning("pin %s not released: %r", path, exc)
