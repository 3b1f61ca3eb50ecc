"""The data path: micro-batches prepared ahead of the step, delivered on the training device.

- A dataset that can build a batch on the device (``batch_on(start, size, device)``,
  e.g. ``synthetic-images``) does so on CUDA, in the training thread: its kernels queue
  behind the previous step's, so the GPU never waits for the host to make or copy data.
- Any other dataset's batches are built ``depth`` micro-batches ahead by one background
  thread (one, so datasets need not be thread-safe), into pinned memory on CUDA. The
  copy of the next micro-batch to the device runs on a side stream while the current one
  computes; the compute stream waits for it on the device (an event wait, not a host wait).
- ``batch(start, size)`` is a pure function of the sample indices, so building ahead in
  another thread changes no value: resume and micro-batch halving stay exact. Asking for
  another position or size (a resume, a halving after an OOM) restarts the stream there.

``wait_s`` is the time the training thread spent blocked on a batch that was not ready.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class _Staged:
    """A micro-batch whose copy to the device was queued on the copy stream."""

    key: tuple[int, int]
    tensors: Batch
    ready: torch.cuda.Event


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
    ) -> None:
        self.dataset = dataset
        self.device = device
        self.channels_last = channels_last
        self.depth = depth
        self.end = end
        self.wait_s = 0.0
        cuda = device.type == "cuda"
        self.on_device = cuda and callable(getattr(dataset, "batch_on", None))
        self._pin = cuda
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="amptrain-data")
            if depth > 0 and not self.on_device
            else None
        )
        self._ahead: deque[tuple[tuple[int, int], Future[Batch]]] = deque()
        self._next = 0
        self._copy_stream = torch.cuda.Stream(device) if cuda and not self.on_device else None
        self._staged: _Staged | None = None

    def get(self, position: int, size: int) -> Batch:
        if self.on_device:
            inputs, targets = self.dataset.batch_on(position, size, self.device)
        elif self._copy_stream is not None:
            inputs, targets = self._from_copy_stream(position, size)
        else:
            inputs, targets = self._host(position, size)
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def reset(self) -> None:
        """Drop everything prepared ahead (e.g. to free device memory after an OOM)."""
        self._staged = None
        for _, future in self._ahead:
            future.cancel()
        self._ahead.clear()

    def close(self) -> None:
        self.reset()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- host side ------------------------------------------------------------------------------

    def _host(self, position: int, size: int) -> Batch:
        """The batch as host tensors (pinned on CUDA), from the prefetch thread when there is one."""
        if self._pool is None:
            return self._build(position, size)
        if not self._ahead or self._ahead[0][0] != (position, size):
            self.reset()
            self._next = position
            self._fill(size)
        _, future = self._ahead.popleft()
        self._fill(size)
        if not future.done():
            started = time.perf_counter()
            future.result()
            self.wait_s += time.perf_counter() - started
        return future.result()

    def _fill(self, size: int) -> None:
        assert self._pool is not None
        while len(self._ahead) < self.depth and (self.end is None or self._next < self.end):
            key = (self._next, size)
            self._ahead.append((key, self._pool.submit(self._build, *key)))
            self._next += size

    def _build(self, position: int, size: int) -> Batch:
        inputs, targets = self.dataset.batch(position, size)
        if self._pin:
            inputs, targets = inputs.pin_memory(), targets.pin_memory()
        return inputs, targets

    # -- device side ----------------------------------------------------------------------------

    def _from_copy_stream(self, position: int, size: int) -> Batch:
        staged = self._staged
        if staged is None or staged.key != (position, size):
            staged = self._copy(position, size)
        self._staged = None
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(staged.ready)
        for t in staged.tensors:
            t.record_stream(compute)  # the allocator must not reuse it before compute is done
        # Queue the next copy now, if its host batch is ready, so it overlaps this compute.
        nxt = (position + size, size)
        if self._ahead and self._ahead[0][0] == nxt and self._ahead[0][1].done():
            self._staged = self._copy(*nxt)
        return staged.tensors

    def _copy(self, position: int, size: int) -> _Staged:
        inputs, targets = self._host(position, size)
        assert self._copy_stream is not None
        with torch.cuda.stream(self._copy_stream):
            tensors = (
                inputs.to(self.device, non_blocking=True),
                targets.to(self.device, non_blocking=True),
            )
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return _Staged((position, size), tensors, ready)
