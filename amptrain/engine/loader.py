"""Micro-batches built in loader worker processes: ``torch.utils.data.DataLoader`` over keys.

Decoding files (JPEGs above all) in Python threads does not scale: the GIL serialises
everything but the decoder's own C call, so a dataset that says it is decode-heavy
(``decode_in_processes = True``) or a spec that asks (``loader_workers`` > 0) gets
processes instead. The DataLoader is used as it is, only its item is a whole micro-batch:

- the map-style :class:`BatchKeys`' item for the key ``(position, size)`` is
  ``dataset.batch(position, size)``, one pure function of its key, so a batch built in any
  process is bitwise the batch built anywhere else (resume, halving and ranks stay exact);
- ``batch_size=None`` (no collation), and the :class:`KeySampler` yields the keys the
  Feeder predicts from the position asked for (the rank's share, up to the end);
- ``persistent_workers``: asking for another position or size (a resume, a micro-batch
  halved after an OOM) starts the sampler again there without forking again. torch's
  ``_MultiProcessingDataLoaderIter._reset`` sends each worker a ``_ResumeIteration`` behind
  the keys already queued and drops every batch that comes back before the worker's
  acknowledgement: stale batches never reach the loop (their build time is still paid);
- ``pin_memory`` on CUDA (torch's pin thread); the Feeder queues the copy to the device on
  its side stream.

A failure inside a worker travels back as the exception itself (not torch's re-wrapped
``Caught X in DataLoader worker`` message), so an ``InvalidSpecError`` naming a corrupt
file reaches the job with its own class and message; the worker's traceback is a note.
Paths a dataset skipped (``take_skipped()``) come back beside the batch built in that process.

Starting or restarting the workers draws nothing from the training process's random
number generators (the DataLoader gets its own generator): dropout stays exact.

Workers are forked (Linux): nothing is pickled and they start in milliseconds. They watch
their parent (torch's ``ManagerWatchdog``, every 5 s): a training process killed with
SIGKILL leaves no loader process behind for long.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data import Dataset as TorchDataset

from amptrain.components.memory_budget import require_memory
from amptrain.contract.spec import JobSpec
from amptrain.engine.data import Batch, Feeder

Key = tuple[int, int]
"""A micro-batch: (position, size)."""

MAX_AUTO_WORKERS = 8
"""Most loader processes the automatic count gives one rank (a spec may ask for up to 64)."""
PREFETCH_FACTOR = 2
"""Micro-batches each loader process builds ahead (torch's default)."""


def default_loader_workers(devices: int = 1) -> int:
    """Loader processes for one rank: the cores this process may use (its affinity), less
    one training thread per rank, shared between the ``devices`` ranks; at most
    :data:`MAX_AUTO_WORKERS` (0 on a one-core machine: there is no core to decode on)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    devices = max(1, devices)
    return max(0, min(MAX_AUTO_WORKERS, (cores - devices) // devices))


@dataclass
class Built:
    """What a loader process hands back for one key: the batch, or why it failed."""

    key: Key
    batch: tuple[torch.Tensor, torch.Tensor] | None
    skipped: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def pin_memory(self) -> Built:
        """The batch in pinned memory: what torch's pin-memory thread calls on an object
        it does not know (else it would pass it through, and the copy to the device would
        not overlap)."""
        if self.batch is None:
            return self
        pinned = (self.batch[0].pin_memory(), self.batch[1].pin_memory())
        return Built(self.key, pinned, self.skipped, self.error)


class BatchKeys(TorchDataset[Built]):
    """The DataLoader's map-style view of a dataset: item ``(position, size)`` is a whole
    micro-batch, ``dataset.batch(position, size)``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, key: Key) -> Built:
        position, size = key
        try:
            batch = self.dataset.batch(position, size)
        except Exception as exc:
            exc.add_note(
                f"raised in loader process {os.getpid()} building samples "
                f"[{position}, {position + size}):\n{traceback.format_exc()}"
            )
            return Built(key, None, self._skipped(), _transportable(exc))
        return Built(key, batch, self._skipped())

    def _skipped(self) -> list[str]:
        take = getattr(self.dataset, "take_skipped", None)
        return list(take()) if callable(take) else []


def _transportable(exc: Exception) -> BaseException:
    """``exc`` if it survives pickling back to the training process (its class, message
    and attributes), else a RuntimeError that names its class and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _as_is(built: Any) -> Any:
    """No collation: a key's item already is its micro-batch (module level: picklable)."""
    return built


class KeySampler(Sampler[Key]):
    """The keys the Feeder will ask for, from ``start`` on: the first one always (even at
    or past ``end``), then ``following(position, size)`` while before ``end``."""

    def __init__(self, following: Callable[[int, int], int], end: int | None) -> None:
        self.following = following
        self.end = end
        self.start: Key = (0, 1)

    def __iter__(self) -> Iterator[Key]:
        position, size = self.start
        while True:
            yield position, size
            position = self.following(position, size)
            if self.end is not None and position >= self.end:
                return


class ProcessBatches:
    """The stream of micro-batches from ``workers`` loader processes, started at a key."""

    def __init__(
        self,
        dataset: Any,
        workers: int,
        *,
        pin: bool,
        following: Callable[[int, int], int],
        end: int | None,
    ) -> None:
        self.workers = workers
        self.sampler = KeySampler(following, end)
        # Fork where there is one: no pickling, no re-import; the workers never touch CUDA.
        fork = sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()
        self.loader = DataLoader(
            BatchKeys(dataset),
            batch_size=None,
            sampler=self.sampler,
            num_workers=workers,
            collate_fn=_as_is,
            pin_memory=pin,
            prefetch_factor=PREFETCH_FACTOR,
            persistent_workers=True,
            multiprocessing_context="fork" if fork else None,
            # Its own generator: each iter() draws the workers' base seed from it, and a draw
            # from the global one would shift the training process's dropout (not exact).
            generator=torch.Generator(),
        )
        self._stream: Iterator[Built] | None = None
        self._expected: Key | None = None

    @property
    def started(self) -> bool:
        """Whether the workers were forked."""
        return self._stream is not None

    def is_next(self, key: Key) -> bool:
        """Whether ``key`` is what the stream delivers next (else it starts again there)."""
        return self._stream is not None and self._expected == key

    def take(self, key: Key) -> Built:
        """What the workers built for ``key`` (its batch, or the error building it raised);
        the stream starts again there if ``key`` was not next."""
        if not self.is_next(key):
            self.sampler.start = key
            # The first call forks the workers; later ones reset them (stale batches dropped).
            self._stream = iter(self.loader)
        assert self._stream is not None
        try:
            built = next(self._stream)
        except StopIteration:  # cannot happen: the sampler yields the key asked for first
            self._expected = None
            raise RuntimeError(f"the loader processes ended before {key}") from None
        if built.key != key:  # a stale batch: _reset drops them all
            raise RuntimeError(f"loader processes delivered {built.key}, expected {key}")
        self._expected = self.sampler.following(*key), key[1]
        if self.sampler.end is not None and self._expected[0] >= self.sampler.end:
            self._expected = None  # the sampler stopped: the next call starts it again
        return built

    def forget(self) -> None:
        """The next :meth:`take` starts the stream again (its batches in flight are dropped)."""
        self._expected = None

    def close(self) -> None:
        """Stop the worker processes (and torch's pin-memory thread)."""
        stream = self.loader._iterator
        self.loader._iterator = None
        self._stream = None
        shutdown = getattr(stream, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()


class ProcessFeeder(Feeder):
    """A :class:`~amptrain.engine.data.Feeder` whose micro-batches come from ``workers``
    loader processes (:class:`ProcessBatches`). On CUDA a dataset that builds batches on the
    device (``batch_on``) still does so; each delivered host batch (pinned by torch) is
    copied on the Feeder's side stream, the compute stream waiting on the device."""

    def __init__(
        self,
        dataset: Any,
        device: torch.device,
        *,
        workers: int,
        channels_last: bool = False,
        end: int | None = None,
        share: tuple[int, int, int] | None = None,
    ) -> None:
        super().__init__(
            dataset, device, channels_last=channels_last, depth=0, end=end, share=share
        )
        self.workers = workers
        pin = device.type == "cuda"
        self._procs = ProcessBatches(
            dataset, workers, pin=pin, following=self.next_position, end=end
        )
        self._skipped: list[str] = []

    def get(self, position: int, size: int) -> Batch:
        if self.on_device:
            return super().get(position, size)
        key = (position, size)
        if not self._procs.is_next(key):
            self.misses += 1
        if not self._procs.started:
            # Skips recorded here so far, gathered before the fork copies them to every worker.
            self._skipped += super().take_skipped()
        started = time.perf_counter()
        built = self._procs.take(key)
        self.wait_s += time.perf_counter() - started
        self.built += 1
        self._skipped += built.skipped
        if built.error is not None:
            raise built.error
        assert built.batch is not None
        if self._copy_stream is None:
            inputs, targets = built.batch
        else:
            inputs, targets = self._receive(self._copy(built.batch, None))
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def take_skipped(self) -> list[str]:
        """Paths skipped since the last call: in the loader processes, then in this one."""
        paths, self._skipped = self._skipped, []
        return paths + super().take_skipped()

    def reset(self) -> None:
        super().reset()
        self._procs.forget()

    def close(self) -> None:
        super().close()
        self._procs.close()


def feeder_for(
    spec: JobSpec,
    dataset: Any,
    device: torch.device,
    share: tuple[int, int, int],
    channels_last: bool,
    depth: int,
    builders: int | None,
) -> Feeder:
    """The job's Feeder: loader processes (``loader_workers``; when null, for a dataset that
    says it decodes files, ``decode_in_processes``, :func:`default_loader_workers`), else
    threads (``depth`` micro-batches ahead, ``builders`` threads for datasets that fill)."""
    workers = spec.loader_workers
    if workers is None:
        heavy = getattr(dataset, "decode_in_processes", False) is True
        workers = default_loader_workers(spec.devices) if heavy else 0
    end = spec.max_steps * spec.batch_size
    if workers > 0:
        _require_window(spec, dataset, workers)
        return ProcessFeeder(
            dataset, device, workers=workers, channels_last=channels_last, end=end, share=share
        )
    return Feeder(
        dataset,
        device,
        channels_last=channels_last,
        depth=depth,
        end=end,
        builders=builders,
        share=share,
    )


def _require_window(spec: JobSpec, dataset: Any, workers: int) -> None:
    """The batches loader processes hold ahead (``PREFETCH_FACTOR`` each, in shared memory,
    plus the one being delivered) must fit: ``too_large`` naming both numbers otherwise, not
    the kernel killing a loader halfway through an epoch."""
    info = getattr(dataset, "info", None)
    if info is None:  # not a dataset the engine built (a test's stand-in): nothing to size
        return
    micro = max(1, spec.batch_size // (spec.grad_accum_steps * spec.world_size))
    sample = math.prod(info.input_shape) * (8 if info.token_inputs else 4)
    target = 8 * (math.prod(info.input_shape) if info.task == "language_model" else 1)
    batches = workers * PREFETCH_FACTOR + 1
    require_memory(
        batches * micro * (sample + target),
        f"the loader's prefetch window ({batches} micro-batches of {micro} samples)",
    )
