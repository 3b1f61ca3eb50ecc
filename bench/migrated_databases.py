"""What a test pays to get a database at the newest schema: replaying the migrations
(``migrate.upgrade``) against copying a migrated template (tests/support/databases.py), on
SQLite, side by side. Wall and CPU per test database; run from the repository root:
``PYTHONPATH=$PWD python -m bench.migrated_databases``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

from amptrain.store import migrate
from tests.support.databases import migrated


def per_database(fn: Callable[[str], None], n: int) -> tuple[float, float]:
    """Mean wall and CPU seconds of ``fn`` on ``n`` fresh SQLite files."""
    wall = cpu = 0.0
    for _ in range(n):
        url = f"sqlite:///{tempfile.mkdtemp(prefix='amp-bench-')}/a.db"
        w, c = time.perf_counter(), time.process_time()
        fn(url)
        wall += time.perf_counter() - w
        cpu += time.process_time() - c
    return wall / n, cpu / n


def main(n: int = 8) -> None:
    migrated(f"sqlite:///{tempfile.mkdtemp(prefix='amp-bench-')}/warm.db")  # the template
    old = per_database(migrate.upgrade, n)
    new = per_database(migrated, n)
    print("| per test database | wall s | CPU s |")
    print("| --- | --- | --- |")
    print(f"| migrate.upgrade | {old[0]:.3f} | {old[1]:.3f} |")
    print(f"| template copy | {new[0]:.3f} | {new[1]:.3f} |")
    print(f"| ratio copy/upgrade | {new[0] / old[0]:.2f} | {new[1] / old[1]:.2f} |")


if __name__ == "__main__":
    main()
