"""Memory figures for the telemetry records, read once per flush.

On CUDA the three record fields come from ONE ``torch.cuda.memory_stats()`` call
(each ``memory_allocated()``-style helper rebuilds that whole dictionary):

- ``memory_allocated``: ``allocated_bytes.all.current``, bytes held by live tensors;
- ``memory_reserved``:  ``reserved_bytes.all.current``, bytes the caching allocator holds;
- ``memory_peak``:      ``allocated_bytes.all.peak``, the most ever allocated by tensors.

On the CPU there is no allocator to ask, so they describe the whole process:

- ``memory_allocated``: private resident memory, ``psutil`` RSS minus shared pages
  (what this process itself keeps in RAM: tensors, Python objects, buffers);
- ``memory_reserved``:  resident set size (RSS), including shared library pages;
- ``memory_peak``:      peak RSS since the process started (``getrusage`` ``ru_maxrss``).
"""

from __future__ import annotations

import resource
import sys
from typing import NamedTuple

import psutil
import torch


class MemorySnapshot(NamedTuple):
    allocated: int
    reserved: int
    peak: int


_PROCESS = psutil.Process()


def snapshot(device: torch.device) -> MemorySnapshot:
    """Current figures for ``device`` (see the module docstring for what each means)."""
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        return MemorySnapshot(
            int(stats.get("allocated_bytes.all.current", 0)),
            int(stats.get("reserved_bytes.all.current", 0)),
            int(stats.get("allocated_bytes.all.peak", 0)),
        )
    info = _PROCESS.memory_info()
    shared = int(getattr(info, "shared", 0))
    return MemorySnapshot(info.rss - shared, info.rss, _peak_rss())


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def format_bytes(n: int) -> str:
    """Human-readable size for error messages."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def release_cached(device: torch.device) -> None:
    """Hand the allocator's cached blocks back (CUDA), e.g. after an out-of-memory error.

    Call it only once the exception is gone: its traceback holds the failed step's
    frames and with them its activations, which ``empty_cache`` cannot release.
    """
    if device.type == "cuda":
        torch.cuda.empty_cache()
