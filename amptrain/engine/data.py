"""The data path: micro-batches prepared ahead of the step, delivered on the training device.

- On CUDA a dataset that can build a batch on the device (``batch_on(start, size, device)``,
  e.g. ``synthetic-images``) does so in the training thread: its kernels queue behind the
  previous step's, so the GPU never waits for the host to make or copy data.
- Any other dataset's batches are built ``depth`` micro-batches ahead by background
  threads. One that can write into given tensors (``fill(start, inputs, targets)``: the
  built-ins) is built straight into reused host buffers, pinned on CUDA, by ``builders``
  threads at once, each a contiguous part of the micro-batch: no second copy to pin it, no
  allocation per batch. Any other runs ``batch(start, size)`` in one thread (so it need
  not be thread-safe) and is then pinned on CUDA.
- A dataset that decodes files (``decode_in_processes``), or a spec that asks
  (``loader_workers``), gets loader processes instead of threads: a torch DataLoader over
  whole micro-batch keys (:class:`~amptrain.engine.loader.ProcessFeeder`).
- On CUDA the thread that completes a host batch queues its copy to the device on a side
  stream at once (and the channels_last conversion behind it), so the copy overlaps the
  steps before the one that uses it; the compute stream waits for it on the device (an
  event wait, not a host wait). A host buffer is written again only once its copy is done.
- Positions are predicted as the loop asks for them: with devices > 1 a rank takes its
  share of every global batch (``share``: rank, world size, batch size), so after the
  end of its share the next position is the same share of the next batch.
- Every sample is a pure function of its index, so building ahead, in parts or in other
  threads changes no value: resume and micro-batch halving stay exact. Asking for another
  position or size (a resume, a halving after an OOM) restarts the stream there.

``wait_s`` is the time the training thread spent blocked on a batch that was not ready,
``built`` the micro-batches built, ``misses`` the times ``get`` found nothing prepared for
its position (the first call included).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

Batch = tuple[torch.Tensor, torch.Tensor]
Layout = tuple[tuple[tuple[int, ...], torch.dtype], tuple[tuple[int, ...], torch.dtype]]
"""A batch's (shape, dtype) of inputs and of targets."""

MIN_PART = 8  # samples: smaller parts of a micro-batch cost more in overhead than they save


def default_builders() -> int:
    """Builder threads for datasets with ``fill``: the cores but one (the training thread's),
    at most 4 (synthetic-images fills 256 images of 224px in ~85 ms in one thread on a slow
    2-core machine: 4 keep well ahead of the ~85 ms bf16 ResNet-50 step of an H200)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores - 1))


@dataclass
class _Delivery:
    """A built micro-batch: host tensors, or device tensors and the event of their copy."""

    tensors: Batch
    ready: torch.cuda.Event | None = None


@dataclass
class _Slot:
    """One reusable host batch: its storages, and the copy to the device that reads it."""

    layout: Layout
    storages: tuple[torch.UntypedStorage, torch.UntypedStorage]
    copied: torch.cuda.Event | None = None

    def idle(self) -> bool:
        """Nothing but this slot holds the storages: no batch, view or autograd graph."""
        return all(torch._C._storage_Use_Count(s._cdata) == 1 for s in self.storages)

    def views(self) -> Batch:
        (xs, xd), (ys, yd) = self.layout
        return _over(self.storages[0], xs, xd), _over(self.storages[1], ys, yd)

    def wait_copied(self) -> None:
        """Called by a builder thread before writing (the copy was queued long before)."""
        copied = self.copied
        if copied is not None:
            copied.synchronize()


def _over(
    storage: torch.UntypedStorage, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A fresh contiguous tensor over ``storage`` (each one counts as a user of it)."""
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)


class _HostBuffers:
    """Host batches reused once idle (pinned on CUDA: a pinned allocation of a 154 MB batch
    costs more than building it); ``keep`` of them at most."""

    def __init__(self, pin: bool, keep: int) -> None:
        self.pin, self.keep = pin, keep
        self._slots: list[_Slot] = []

    def take(self, layout: Layout) -> _Slot:
        for slot in self._slots:
            if slot.layout == layout and slot.idle():
                return slot
        # A new size (a halved micro-batch): idle buffers of another one are not needed again.
        self._slots = [s for s in self._slots if s.layout == layout or not s.idle()]
        (xs, xd), (ys, yd) = layout
        tensors = (
            torch.empty(xs, dtype=xd, pin_memory=self.pin),
            torch.empty(ys, dtype=yd, pin_memory=self.pin),
        )
        slot = _Slot(layout, (tensors[0].untyped_storage(), tensors[1].untyped_storage()))
        if len(self._slots) < self.keep:
            self._slots.append(slot)
        return slot


@dataclass
class _Ahead:
    """A micro-batch being built: its (position, size), its result, its queued work."""

    key: tuple[int, int]
    future: Future[_Delivery] = field(default_factory=Future)
    work: list[Future[None]] = field(default_factory=list)


def _settle(future: Future[_Delivery], result: _Delivery | None, exc: BaseException | None) -> None:
    """Set a result or an exception, unless the batch was dropped (reset) meanwhile."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass


class Feeder:
    """``get(position, size)`` returns samples ``[position, position + size)`` on the device."""

    def __init__(
        self,
        dataset: Any,
        device: torch.device,
        *,
        channels_last: bool = False,
        depth: int = 2,
        end: int | None = None,
        builders: int | None = None,
        share: tuple[int, int, int] | None = None,
    ) -> None:
        self.dataset = dataset
        self.device = device
        self.channels_last = channels_last
        self.depth = depth
        self.end = end
        self.share = share
        self.wait_s = 0.0
        self.built = 0
        self.misses = 0
        cuda = device.type == "cuda"
        self.on_device = cuda and callable(getattr(dataset, "batch_on", None))
        self.fills = callable(getattr(dataset, "fill", None))
        self.builders = (builders or default_builders()) if self.fills else 1
        self._pool = (
            ThreadPoolExecutor(self.builders, thread_name_prefix="amptrain-data")
            if depth > 0 and not self.on_device
            else None
        )
        self._buffers = _HostBuffers(pin=cuda, keep=depth + 2)
        self._layout: Layout | None = None
        self._ahead: deque[_Ahead] = deque()
        self._next = 0
        self._generation = 0  # bumped by reset(): parts of a dropped batch queue no copy
        self._copy_stream = torch.cuda.Stream(device) if cuda and not self.on_device else None

    def get(self, position: int, size: int) -> Batch:
        if self.on_device:
            inputs, targets = self.dataset.batch_on(position, size, self.device)
        elif self._pool is None:
            self.misses += 1
            inputs, targets = self._receive(self._build_now(position, size))
        else:
            inputs, targets = self._receive(self._prepared(position, size))
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def reset(self) -> None:
        """Drop everything prepared ahead (e.g. to free device memory after an OOM)."""
        self._generation += 1
        for ahead in self._ahead:
            ahead.future.cancel()
            for work in ahead.work:
                work.cancel()  # not started yet: never started
        self._ahead.clear()

    def close(self) -> None:
        self.reset()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def take_skipped(self) -> list[str]:
        """Relative paths the dataset skipped since the last call (``take_skipped``), if any."""
        take = getattr(self.dataset, "take_skipped", None)
        return list(take()) if callable(take) else []

    def next_position(self, position: int, size: int) -> int:
        """Where the micro-batch after ``[position, position + size)`` starts for this rank."""
        following = position + size
        if self.share is None:
            return following
        rank, world, batch = self.share
        part = batch // world
        step = position - position % batch
        if following >= step + (rank + 1) * part:  # past this rank's part of the batch
            following = step + batch + rank * part
        return following

    # -- the training thread ----------------------------------------------------------------------

    def _prepared(self, position: int, size: int) -> _Delivery:
        if not self._ahead or self._ahead[0].key != (position, size):
            self.misses += 1
            self.reset()
            self._next = position
            self._schedule_ahead(size)
        ahead = self._ahead.popleft()
        self._schedule_ahead(size)
        if not ahead.future.done():
            started = time.perf_counter()
            ahead.future.exception()  # waits; a failure is raised by result() below
            self.wait_s += time.perf_counter() - started
        return ahead.future.result()

    def _receive(self, delivery: _Delivery) -> Batch:
        if delivery.ready is None:
            return delivery.tensors
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(delivery.ready)
        for t in delivery.tensors:
            t.record_stream(compute)  # the allocator must not reuse it before compute is done
        return delivery.tensors

    def _schedule_ahead(self, size: int) -> None:
        while len(self._ahead) < self.depth and (self.end is None or self._next < self.end):
            ahead = _Ahead((self._next, size))
            self._schedule(ahead)
            self._ahead.append(ahead)
            self._next = self.next_position(self._next, size)

    def _schedule(self, ahead: _Ahead) -> None:
        assert self._pool is not None
        position, size = ahead.key
        self.built += 1
        generation = self._generation
        if not self.fills:
            ahead.work.append(
                self._pool.submit(self._whole, ahead.future, position, size, generation)
            )
            return
        slot = self._buffers.take(self._layout_of(size))
        inputs, targets = slot.views()
        parts = _parts(size, self.builders)
        left = [len(parts)]
        lock = threading.Lock()

        def part(a: int, b: int) -> None:
            if generation != self._generation:
                return  # dropped by reset() before this part started
            try:
                slot.wait_copied()
                self.dataset.fill(position + a, inputs[a:b], targets[a:b])
            except BaseException as exc:
                _settle(ahead.future, None, exc)
                return
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._deliver(ahead.future, (inputs, targets), generation, slot)

        ahead.work += [self._pool.submit(part, a, b) for a, b in parts]

    def _layout_of(self, size: int) -> Layout:
        if self._layout is None:  # one sample shows the shapes and dtypes
            x, y = self.dataset.batch(0, 1)
            self._layout = ((tuple(x.shape[1:]), x.dtype), (tuple(y.shape[1:]), y.dtype))
        (xs, xd), (ys, yd) = self._layout
        return ((size, *xs), xd), ((size, *ys), yd)

    # -- builder threads ----------------------------------------------------------------------------

    def _whole(self, future: Future[_Delivery], position: int, size: int, generation: int) -> None:
        try:
            host = self.dataset.batch(position, size)
            if self._copy_stream is not None:
                host = (host[0].pin_memory(), host[1].pin_memory())
        except BaseException as exc:
            _settle(future, None, exc)
            return
        self._deliver(future, host, generation, None)

    def _deliver(
        self, future: Future[_Delivery], host: Batch, generation: int, slot: _Slot | None
    ) -> None:
        """The last builder of a batch: queue its copy to the device now (CUDA)."""
        try:
            if self._copy_stream is None or generation != self._generation:
                delivery = _Delivery(host)
            else:
                delivery = self._copy(host, slot)
        except BaseException as exc:
            _settle(future, None, exc)
            return
        _settle(future, delivery, None)

    def _copy(self, host: Batch, slot: _Slot | None) -> _Delivery:
        assert self._copy_stream is not None
        # A builder thread's current device is 0 whatever this rank's is: name it.
        with torch.cuda.device(self.device), torch.cuda.stream(self._copy_stream):
            inputs = host[0].to(self.device, non_blocking=True)
            if self.channels_last and inputs.dim() == 4:
                inputs = inputs.contiguous(memory_format=torch.channels_last)
            targets = host[1].to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        if slot is not None:
            slot.copied = ready  # before this thread lets go of the slot's views
        return _Delivery((inputs, targets), ready)

    def _build_now(self, position: int, size: int) -> _Delivery:
        """No prefetch: the batch built in the training thread (and copied, on CUDA)."""
        host = self.dataset.batch(position, size)
        if self._copy_stream is None:
            return _Delivery(host)
        return self._copy((host[0].pin_memory(), host[1].pin_memory()), None)


def _parts(size: int, builders: int) -> list[tuple[int, int]]:
    """``[0, size)`` cut into up to ``builders`` contiguous parts of at least MIN_PART."""
    n = max(1, min(builders, size // MIN_PART))
    bounds = [size * i // n for i in range(n + 1)]
    return list(itertools.pairwise(bounds))
