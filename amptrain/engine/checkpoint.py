"""Atomic checkpoint files, newest-wins resume, and the RNG states they carry.

Files are named ``step-000000500.pt`` so lexical order is step order. A file is
written to a temporary name in the same directory and renamed into place
(``os.replace`` locally, ``fs.mv`` for fsspec URLs), so a reader sees either
nothing or a complete checkpoint, even when the writer is killed mid-save.
Everything is stored as tensors and plain Python types so that
``torch.load(weights_only=True)`` can read it back.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec
import numpy as np
import torch
from fsspec.implementations.local import LocalFileSystem

from amptrain.contract.errors import ResumeMismatchError
from amptrain.contract.layout import (
    checkpoint_name,
    checkpoint_step,
    pin_name,
    pinned_step,
    shards_name,
    weights_name,
)

CHECKPOINT_FORMAT = 3
"""What :meth:`~amptrain.engine.loop.Trainer.state_dict` writes and the only format
:meth:`~amptrain.engine.loop.Trainer.load_state_dict` reads (another is refused as
``resume_mismatch``; 3: the spike window as running sums, and ``rollbacks``, the spike
rollbacks taken). The schedule is ``{"applied_steps": n}``; ``world_size`` is the number
of devices that wrote it; with more than one, ``rng_per_rank`` holds every rank's RNG
states in rank order. ``parallelism`` (absent: ``ddp``): with ``fsdp`` its ``model`` and
``optimizer`` are None, their shards being in the Distributed Checkpoint directory beside
it (``step-N.dcp``, in place before the file is)."""


def check_resumable(state: dict[str, Any], world_size: int, parallelism: str = "ddp") -> None:
    """Refuse a checkpoint this engine did not write, or one written by another number of
    devices or another ``parallelism``, before reading any of it (``resume_mismatch``)."""
    found = state.get("format")
    step = state.get("step") if isinstance(state.get("step"), int) else None
    at = f" (step {step})" if step is not None else ""
    if found != CHECKPOINT_FORMAT:
        raise ResumeMismatchError(
            f"cannot resume: the newest checkpoint{at} is of format {found!r} and this engine "
            f"reads format {CHECKPOINT_FORMAT} only. Start afresh (another checkpoint "
            "directory, or --no-resume)",
            step=step,
        )
    saved = int(state["world_size"])
    if saved != world_size:
        raise ResumeMismatchError(
            f"cannot resume: the newest checkpoint{at} was written by {saved} device(s) and "
            f"this run has {world_size}; exact resume needs the same number (RNG states and "
            f"data shares are per device, and fsdp's model and optimizer shards too). Run "
            f"with devices: {saved}, or start afresh (another checkpoint directory, or "
            "--no-resume)",
            step=step,
        )
    written = state.get("parallelism", "ddp")  # before fsdp existed: ddp
    if written != parallelism:
        raise ResumeMismatchError(
            f"cannot resume: the newest checkpoint{at} was written with parallelism "
            f"{written} and this run uses {parallelism}; the model and optimizer are stored "
            f"differently. Run with parallelism: {written}, or start afresh (another "
            "checkpoint directory, or --no-resume)",
            step=step,
        )


_TMP_PREFIX = ".tmp-"
_META_SUFFIX = ".json"
_WEIGHTS_SUFFIX = ".safetensors"
_SHARDS_SUFFIX = ".dcp"


def _without_suffix(path: str) -> str:
    for suffix in (_META_SUFFIX, _WEIGHTS_SUFFIX, _SHARDS_SUFFIX):
        path = path.removesuffix(suffix)
    return path


@dataclass(frozen=True)
class CheckpointMeta:
    """What is known of a checkpoint without loading it (its sidecar ``step-N.json``)."""

    step: int
    healthy: bool
    """Written with no trigger of ``health.fallback`` building: what a precision fallback and
    a spike rollback may go back to."""
    attempt: int
    """The attempt that wrote it (its lineage: see ``RunContext.recorded``)."""

    def to_json(self) -> bytes:
        return json.dumps(
            {"step": self.step, "healthy": self.healthy, "attempt": self.attempt}
        ).encode()

    @classmethod
    def of_state(cls, state: dict[str, Any]) -> CheckpointMeta:
        """From a loaded checkpoint (one written before sidecars existed)."""
        step = state.get("step")
        return cls(
            int(step) if isinstance(step, int) else -1,
            bool(state.get("healthy", False)),
            int(state.get("attempt", 0)),
        )


class CheckpointStore:
    """One job's checkpoint directory (local path or fsspec URL): atomic files, each with a
    sidecar of its :class:`CheckpointMeta`, so what a checkpoint is can be known without
    loading it. Which ones to keep and which to go back to is the
    :class:`~amptrain.engine.checkpoint_manager.CheckpointManager`'s to decide."""

    def __init__(self, url: str, keep_last: int = 1, *, writer: bool = True) -> None:
        """``writer`` False: only reads (the ranks > 0 of a data-parallel run, which must
        not remove what rank 0, the one writer, is writing). ``keep_last``: kept for callers
        that only read; pruning is the manager's."""
        self._fs, self._root = fsspec.core.url_to_fs(url)
        self._local = isinstance(self._fs, LocalFileSystem)
        self.keep_last = keep_last
        self._fs.makedirs(self._root, exist_ok=True)
        if writer:
            self._remove_stale_temporaries()

    def path(self, name: str) -> str:
        return f"{self._root.rstrip('/')}/{name}"

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints present, oldest first."""
        names = (os.path.basename(p) for p in self._fs.ls(self._root, detail=False))
        return sorted(step for n in names if (step := checkpoint_step(n)) is not None)

    def pinned(self) -> set[int]:
        """Steps a fork has pinned (``step-N.pin-<fork>``): pruning keeps them. Read at every
        prune, not indexed: the API pins while this job trains."""
        names = (os.path.basename(p) for p in self._fs.ls(self._root, detail=False))
        return {step for n in names if (step := pinned_step(n)) is not None}

    def release_pin(self, step: int, fork_id: str) -> None:
        """Remove a fork's pin of ``step`` (none there: nothing to do)."""
        path = self.path(pin_name(step, fork_id))
        if self._fs.exists(path):
            self._fs.rm(path)

    def latest(self) -> str | None:
        """Path of the newest complete checkpoint (as :meth:`load` takes it), or None."""
        steps = self.steps()
        return self.path(checkpoint_name(steps[-1])) if steps else None

    def discard_after(self, step: int) -> list[int]:
        """Remove the checkpoints of steps beyond ``step``; the steps removed."""
        gone = [s for s in self.steps() if s > step]
        for s in gone:
            self.remove(s)
        return gone

    def remove(self, step: int) -> None:
        """Remove one checkpoint: the file first (a sidecar without its file is ignored)."""
        self._fs.rm(self.path(checkpoint_name(step)))
        for beside in (self._meta_path(step), self.path(weights_name(step))):
            if self._fs.exists(beside):
                self._fs.rm(beside)
        if self._fs.exists(self.path(shards_name(step))):
            self._fs.rm(self.path(shards_name(step)), recursive=True)

    def shards_temporary(self, step: int) -> str:
        """Where every rank writes the shards of ``step``'s checkpoint (fsdp) before
        :meth:`publish_shards`: the same name on every rank, a temporary one (removed as
        stale by the next writer if this one dies before the rename). A local path, or a
        full URL (what Distributed Checkpoint takes)."""
        return self._url(self.path(f"{_TMP_PREFIX}{shards_name(step)}"))

    def shards(self, step: int) -> str:
        """Where the shards of ``step``'s checkpoint are (as :meth:`shards_temporary`)."""
        return self._url(self.path(shards_name(step)))

    def _url(self, path: str) -> str:
        return path if self._local else self._fs.unstrip_protocol(path)

    def publish_shards(self, step: int) -> str:
        """The writer renames the complete shards into place (after every rank wrote its
        own), before it writes the checkpoint file: a ``.pt`` never exists without them."""
        final = self.path(shards_name(step))
        if self._fs.exists(final):  # an earlier attempt's, never completed by its .pt
            self._fs.rm(final, recursive=True)
        self._fs.mv(self.path(f"{_TMP_PREFIX}{shards_name(step)}"), final, recursive=True)
        return final

    def save(
        self, step: int, state: dict[str, Any], meta: CheckpointMeta, weights: bytes | None = None
    ) -> str:
        """Write ``state`` atomically as the checkpoint of ``step``, its sidecar first (a
        checkpoint never exists without it; a sidecar left without its file is ignored), and
        ``weights`` (a safetensors file of the model alone) before the checkpoint too.

        Returns where it went: a local path, or a full URL for other filesystems.
        """
        final = self.path(checkpoint_name(step))
        tmp = self.path(f"{_TMP_PREFIX}{uuid.uuid4().hex}-{checkpoint_name(step)}")
        meta_tmp = self.path(f"{_TMP_PREFIX}{uuid.uuid4().hex}{_META_SUFFIX}")
        beside = [(meta.to_json(), self._meta_path(step))]
        if weights is not None:
            beside.append((weights, self.path(weights_name(step))))
        if self._local:
            for data, path in beside:
                tmp_beside = self.path(f"{_TMP_PREFIX}{uuid.uuid4().hex}-{os.path.basename(path)}")
                self._save_local(_writer(data), tmp_beside, path)
            self._save_local(lambda f: torch.save(state, f), tmp, final)
        else:
            for data, path in beside:
                self._fs.pipe(meta_tmp, data)
                self._fs.mv(meta_tmp, path)
            with self._fs.open(tmp, "wb") as f:
                torch.save(state, f)
            self._fs.mv(tmp, final)
        return final if self._local else self._fs.unstrip_protocol(final)

    def meta(self, step: int) -> CheckpointMeta:
        """What the checkpoint of ``step`` is, from its sidecar (loading the checkpoint only
        when it has none: one written before sidecars existed)."""
        try:
            with self._fs.open(self._meta_path(step), "rb") as f:
                data = json.loads(f.read())
            return CheckpointMeta(step, bool(data["healthy"]), int(data["attempt"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            found = CheckpointMeta.of_state(self.load(self.path(checkpoint_name(step))))
            return CheckpointMeta(step, found.healthy, found.attempt)

    def _meta_path(self, step: int) -> str:
        return self.path(checkpoint_name(step).removesuffix(".pt") + _META_SUFFIX)

    def load(self, path: str) -> dict[str, Any]:
        with self._fs.open(path, "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=True)

    def _save_local(self, write: Callable[[BinaryIO], object], tmp: str, final: str) -> None:
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())  # the data is on disk before the name points at it
            os.replace(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self._root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # and so is the rename
        finally:
            os.close(dir_fd)

    def _remove_stale_temporaries(self) -> None:
        # Left by a writer that was killed mid-save; one job has one writer
        # (the worker fences attempts), so anything here now is garbage.
        for p in self._fs.ls(self._root, detail=False):
            name = os.path.basename(p)
            if name.startswith(_TMP_PREFIX):
                self._fs.rm(p, recursive=True)  # fsdp's shards are a directory
            elif name.endswith((_META_SUFFIX, _WEIGHTS_SUFFIX, _SHARDS_SUFFIX)) and not (
                self._fs.exists(_without_suffix(p) + ".pt")
            ):
                # beside a checkpoint that was never renamed into place
                self._fs.rm(p, recursive=True)


def _writer(data: bytes) -> Callable[[BinaryIO], object]:
    return lambda f: f.write(data)


def capture_rng(cuda_device: torch.device | None = None) -> dict[str, Any]:
    """Every RNG the run may draw from, as tensors and plain types (weights_only-safe).

    ``cuda_device``: keep only that GPU's generator (a data-parallel rank: reading every
    GPU's would create a CUDA context on each of them)."""
    np_state: tuple[Any, ...] = tuple(np.random.get_state())
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if cuda_device is not None:
        state["cuda_device"] = torch.cuda.get_rng_state(cuda_device)
    elif torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], cuda_device: torch.device | None = None) -> None:
    """Inverse of :func:`capture_rng` (``cuda_device``: the GPU a ``cuda_device`` state goes to)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "cuda_device" in state and cuda_device is not None:
        torch.cuda.set_rng_state(state["cuda_device"], cuda_device)
