"""Where the recorder's CPU goes, part by part (``bench/recorder_throughput.py --parts``): the
functions on its path wrapped with a per-thread CPU clock, without a profiler's overhead.

A part is named by the module attribute the recorder calls through, so the same names
resolve in a ``--before`` tree; a part that tree lacks is left out (its time stays in
``other``). Parts nest inside ``record`` (the writer's transaction) and ``pass`` (one
loop turn); ``other`` is what the named parts leave of ``pass``. ``gc``, the garbage
collector's runs in the recorder thread, is also inside the parts that allocate.
"""

from __future__ import annotations

import functools
import gc
import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

PARTS: tuple[tuple[str, str, str, str], ...] = (
    # (part, module, object in it ('' for the module itself), function)
    ("pass", "amptrain.server.recorder.service", "Recorder", "_pass"),
    ("record", "amptrain.server.recorder.writer", "BatchWriter", "record"),
    ("redis read", "amptrain.server.recorder.group", "ConsumerGroup", "read_new"),
    ("decode", "amptrain.server.recorder.writer", "", "parse"),
    ("progress", "amptrain.store.recording", "", "update_progress"),
    # The row writes of a --before tree older than migration 0017 (this tree has none).
    ("point rows", "amptrain.store.recording", "", "insert_points"),
    ("eval rows", "amptrain.store.history.value_writes", "", "insert"),
    ("eval rows: summary", "amptrain.store.history.value_writes", "", "refresh_summary"),
    ("eval summary", "amptrain.store.history.eval_summary", "", "refresh"),
    ("chunks", "amptrain.store.history.rollups", "", "record"),
    # Inside "chunks" (shown apart, not summed again): where the chunk and roll-up writes'
    # time goes (the recorder writes both through rollups.record).
    ("chunks: gather", "amptrain.store.history.chunk_writes", "", "gather"),
    ("chunks: read", "amptrain.store.history.chunk_writes", "", "read"),
    ("chunks: merge", "amptrain.store.history.chunk_writes", "", "_merge"),
    ("chunks: rows", "amptrain.store.history.chunk_writes", "", "_rows"),
    ("chunks: encode (in rows)", "amptrain.store.history.chunk_codec", "", "encode"),
    ("chunks: upsert", "amptrain.store.history.chunk_writes", "", "upsert"),
    ("chunks: roll-ups", "amptrain.store.history.rollups", "", "keep"),
    ("chunks: exemplars (in roll-ups)", "amptrain.store.history.exemplars", "", "keep"),
    ("alerts", "amptrain.server.recorder.alerting", "", "evaluate"),
    ("commit", "sqlalchemy.orm", "Session", "commit"),
    ("ack", "amptrain.server.recorder.group", "ConsumerGroup", "ack"),
)
"""What is timed. The writer imports ``parse`` by name, so it is replaced in the writer."""
NESTING = ("pass", "record", "gc")
"""Parts that hold others: shown, but not summed into ``other``."""


THREAD = "recorder"
"""The name of the thread whose calls count (the bench's own calls, say creating jobs, do not)."""


class Parts:
    """Wraps every part it finds; :meth:`reset` before the measured run,
    :meth:`us_per_point` after it."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        for part, module, owner, name in PARTS:
            try:
                where: Any = importlib.import_module(module)
                where = getattr(where, owner) if owner else where
                fn = getattr(where, name)
            except (ImportError, AttributeError):
                continue
            self.cpu[part] = 0.0
            setattr(where, name, self._timed(part, fn))
        # The garbage collector runs inside whichever part allocates: shown apart as well.
        self.cpu["gc"] = 0.0
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, _info: dict[str, Any]) -> None:
        if threading.current_thread().name != THREAD:
            return
        if phase == "start":
            self._gc_start = time.thread_time()
        else:
            self.cpu["gc"] += time.thread_time() - self._gc_start

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        cpu = self.cpu

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name != THREAD:
                return fn(*args, **kwargs)
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu[part] += time.thread_time() - start

        return timed

    def reset(self) -> None:
        """Forget what earlier runs of the recorder thread spent."""
        self.cpu.update(dict.fromkeys(self.cpu, 0.0))

    def us_per_point(self, points: int, thread_cpu: float) -> dict[str, float]:
        """Each part's CPU in microseconds per point; ``other``: the rest of the thread."""
        out = {part: s / points * 1e6 for part, s in self.cpu.items()}
        leaves = sum(v for k, v in out.items() if k not in NESTING and ": " not in k)
        out["other"] = thread_cpu / points * 1e6 - leaves
        return out
