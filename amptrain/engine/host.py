"""Where device values reach the host, and a counter of the host's waits on a GPU.

The engine reads device values on the host in one place only, :class:`HostReads`, once per
telemetry flush (plus the checkpoint, which is a flush point): :meth:`HostReads.floats`
reads at once (on CUDA a wait for the device), :meth:`HostReads.start` queues a copy into
pinned host memory that a later flush reads without waiting (CUDA). Every other per-step
value (loss, grad norm, inf flag, loss scale, learning rate, applied steps) stays on the
device between flushes. Tests count the calls here and, with a dispatch mode, every
``.item()``-style read anywhere, to prove it.

:class:`HostWaits` counts what makes the host wait for a CUDA device: stream, event and
device synchronizations, through PyTorch's GPU trace hooks. ``.item()``, ``.tolist()``
and blocking copies report as stream synchronizations; ``Event.synchronize()``, which
``torch.cuda.set_sync_debug_mode`` does not see, reports as an event synchronization.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import torch


class HostReads:
    """The engine's one door from device values to the host; ``count`` says how often it opened."""

    def __init__(self) -> None:
        self.count = 0

    def floats(
        self, values: Sequence[torch.Tensor], vectors: Sequence[torch.Tensor] = ()
    ) -> list[float]:
        """One transfer for all ``values`` (0-d tensors; mixed dtypes promoted, as
        ``torch.stack`` does), then the elements of ``vectors`` (1-D): a sync on CUDA."""
        self.count += 1
        return _joined(values, vectors).tolist()

    def start(
        self, values: Sequence[torch.Tensor], vectors: Sequence[torch.Tensor] = ()
    ) -> InFlight:
        """One copy of all ``values`` (0-d CUDA tensors, promoted to one dtype) and then the
        elements of ``vectors`` into pinned host memory, queued behind the work that computes
        them: no wait. Read it once ``done``."""
        self.count += 1
        stacked = _joined(values, vectors)
        host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
        host.copy_(stacked, non_blocking=True)
        done = torch.cuda.Event(enable_timing=True)  # timed: the window's device time
        done.record()
        return InFlight(host, done)

    def mark(self) -> CopyDone:
        """A timed event recorded now on the current stream (where a read window starts)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def table(self, rows: torch.Tensor) -> list[list[float]]:
        """One transfer of a 2-D tensor (devices > 1: every rank's values of one flush)."""
        self.count += 1
        return rows.tolist()


def _joined(values: Sequence[torch.Tensor], vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(list(values))
    return torch.cat([stacked, *vectors]) if vectors else stacked


class LateHostReads(HostReads):
    """A CPU run's reads in the single-GPU order: a queued copy completes only once the
    next one is queued (or a read window's mark is set), as a GPU that finishes each window
    by the next flush does. So a due flush publishes the window before the newest, and the
    read order every guardian decision meets on one GPU is tested on any CPU."""

    def __init__(self) -> None:
        super().__init__()
        self._queued: list[LateEvent] = []

    def start(
        self, values: Sequence[torch.Tensor], vectors: Sequence[torch.Tensor] = ()
    ) -> InFlight:
        self.count += 1
        return InFlight(_joined(values, vectors).clone(), self._next())

    def mark(self) -> LateEvent:
        return self._next()

    def _next(self) -> LateEvent:
        for queued in self._queued:  # the device caught up with everything queued before
            queued.completed = True
        self._queued = [LateEvent()]
        return self._queued[0]


class LateEvent:
    """What :class:`LateHostReads` hands out for a CUDA event: done once a later one exists;
    timed by the host's clock (a CPU has done the work when it is recorded)."""

    def __init__(self) -> None:
        self.completed = False
        self.at = time.perf_counter()

    def query(self) -> bool:
        return self.completed

    def synchronize(self) -> None:
        self.completed = True

    def elapsed_time(self, end: CopyDone) -> float:
        assert isinstance(end, LateEvent) and self.completed and end.completed, "not reached"
        return (end.at - self.at) * 1000.0


class CopyDone(Protocol):
    """A CUDA event, as a read window uses it (or a :class:`LateEvent`)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: Any, /) -> float: ...


@dataclass
class InFlight:
    """Values on their way to pinned host memory; ``done`` is recorded right behind the copy."""

    host: torch.Tensor
    done: CopyDone

    def floats(self) -> list[float]:
        """The values, once ``done.query()`` is True (or after ``done.synchronize()``)."""
        values: list[float] = self.host.tolist()
        return values


_KINDS = ("event_synchronization", "stream_synchronization", "device_synchronization")


class HostWaits:
    """While active, counts CUDA host waits by kind and by thread name.

    ``with HostWaits() as waits: ...`` then ``waits.total`` or ``waits.by_kind``. The
    trace hooks stay armed in the process afterwards (PyTorch cannot disarm them); the
    callbacks are removed, so the cost left behind is a no-op Python call per sync.
    """

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.by_thread: Counter[str] = Counter()
        self._callbacks: list[tuple[Any, Callable[..., None]]] = []
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def __enter__(self) -> HostWaits:
        from torch.cuda import _gpu_trace

        torch._C._activate_gpu_trace()
        for kind in _KINDS:
            registry = getattr(_gpu_trace, _registry_name(kind))
            callback = self._counter(kind)
            registry.add_callback(callback)
            self._callbacks.append((registry, callback))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for registry, callback in self._callbacks:
            registry.callback_list.remove(callback)
        self._callbacks.clear()

    def _counter(self, kind: str) -> Callable[..., None]:
        def count(*_: Any) -> None:
            with self._lock:
                self.by_kind[kind] += 1
                self.by_thread[threading.current_thread().name] += 1

        return count


def _registry_name(kind: str) -> str:
    # event_synchronization -> EventSynchronizationCallbacks
    return "".join(part.title() for part in kind.split("_")) + "Callbacks"
