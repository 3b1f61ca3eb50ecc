"""``amptrain api`` with diagnostics for ``bench/load.py --tracemalloc`` / ``--pool-debug``.

SIGUSR2 writes where each database connection now checked out of a pool was taken
(grouped by stack) to ``$AMPTRAIN_DATA_DIR/checkouts.txt``: who holds the pool.

The first SIGUSR1
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


_held: dict[int, tuple[str, float]] = {}


def _track_checkouts() -> None:
    import threading
    import time
    import traceback

    import sqlalchemy as sa

    import amptrain

    package = str(Path(amptrain.__file__).parent) + os.sep  # amptrain's frames name the holder

    def checkout(_dbapi: object, record: object, _proxy: object) -> None:
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(package)]
        where = " <- ".join(
            f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[::-1][:5]
        )
        _held[id(record)] = (f"[{threading.current_thread().name}] {where}", time.monotonic())

    def checkin(_dbapi: object, record: object) -> None:
        _held.pop(id(record), None)

    sa.event.listen(sa.pool.Pool, "checkout", checkout)
    sa.event.listen(sa.pool.Pool, "checkin", checkin)


def _dump_checkouts(_sig: int, _frame: FrameType | None) -> None:
    import collections
    import time

    now = time.monotonic()
    by_where: dict[str, list[float]] = collections.defaultdict(list)
    for where, since in list(_held.values()):
        by_where[where].append(now - since)
    lines = [f"{len(_held)} connections checked out:"]
    for where, ages in sorted(by_where.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(ages)} held up to {max(ages):.1f} s, taken at {where}")
    out = Path(os.environ["AMPTRAIN_DATA_DIR"]) / "checkouts.txt"
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    _track_checkouts()
    signal.signal(signal.SIGUSR2, _dump_checkouts)
    signal.signal(signal.SIGUSR1, _dump)
    sys.argv = ["amptrain", *sys.argv[1:]]
    runpy.run_module("amptrain.cli.main", run_name="__main__", alter_sys=True)
