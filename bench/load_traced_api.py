"""``amptrain api`` under tracemalloc, for ``bench/load.py --tracemalloc``. The first SIGUSR1
starts tracing (tracing start-up would make it too slow); the next writes what was
allocated since then and is still alive, grouped by traceback, biggest first, to
``$AMPTRAIN_DATA_DIR/tracemalloc.txt``: in a process whose memory grows, its owners.

    python bench/load_traced_api.py api --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 8
TOP = 12


def _dump(_sig: int, _frame: FrameType | None) -> None:
    if not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
        return
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # grouping takes a while: no re-entry
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    lines = [f"allocated since tracing started and still alive: {_total(snap):.1f} MiB; top:"]
    for stat in snap.statistics("traceback")[:TOP]:
        lines.append(f"{stat.size / 2**20:.1f} MiB in {stat.count} blocks:")
        lines.extend("    " + line for line in stat.traceback.format())
    out = Path(os.environ["AMPTRAIN_DATA_DIR"]) / "tracemalloc.txt"
    out.write_text("\n".join(lines) + "\n")


def _total(snap: tracemalloc.Snapshot) -> float:
    return sum(t.size for t in snap.traces) / 2**20


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    signal.signal(signal.SIGUSR1, _dump)
    sys.argv = ["amptrain", *sys.argv[1:]]
    runpy.run_module("api.cli.main", run_name="__main__", alter_sys=True)
