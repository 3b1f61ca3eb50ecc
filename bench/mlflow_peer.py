"""The MLflow peer of amptrain's history benches: one run recorded and read through MLflow's
own tracking store (``SqlAlchemyStore`` on a SQLite file, what ``mlflow server`` uses),
with no HTTP in between, as amptrain's benches measure their store.

Run BY the python of a venv with MLflow installed (never the project's venv; see
:func:`bench.common.mlflow_peer`, which starts it):

    /work/mlflow-venv/bin/python bench/mlflow_peer.py --steps 100000 --fields 6 ROOT

1. ingest: ``--steps`` steps of ``--fields`` metrics (``f0``, ``f1``, ...) with
   ``log_batch``, as many steps per call as MLflow takes (1,000 metrics a batch);
2. a 1,000-point sampled read of one metric over the whole run
   (``get_metric_history_bulk_interval``, the sampled history the MLflow UI's charts read);
3. that metric's full history (``get_metric_history``).

Prints one JSON line: for each, CPU seconds of this process (MLflow and SQLite run in it),
wall seconds, and the counts read. Imports nothing of amptrain.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

BATCH_METRICS = 1000
"""MLflow's limit of metrics per ``log_batch``."""


def clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def since(start: tuple[float, float]) -> dict[str, float]:
    cpu, wall = clock()
    return {"cpu_s": cpu - start[0], "wall_s": wall - start[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="an empty directory for the SQLite file")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--fields", type=int, default=6)
    args = parser.parse_args()

    import mlflow
    from mlflow.entities import Metric
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    root = args.root.resolve()
    store = SqlAlchemyStore(f"sqlite:///{root / 'mlflow.db'}", str(root / "artifacts"))
    experiment = store.create_experiment("peer")
    run = store.create_run(experiment, "bench", int(time.time() * 1000), [], "peer")
    run_id = run.info.run_id
    names = [f"f{i}" for i in range(args.fields)]
    per_call = max(1, BATCH_METRICS // args.fields)
    t0 = int(time.time() * 1000)

    start = clock()
    for first in range(1, args.steps + 1, per_call):
        last = min(args.steps, first + per_call - 1)
        metrics = [
            Metric(name, math.sin(step / 100) + i, t0 + step, step)
            for step in range(first, last + 1)
            for i, name in enumerate(names)
        ]
        store.log_batch(run_id, metrics=metrics, params=[], tags=[])
    ingest = since(start)

    start = clock()
    sampled = store.get_metric_history_bulk_interval([run_id], names[0], 1000, None, None)
    sampled_read = {**since(start), "points": len(sampled)}

    start = clock()
    full = store.get_metric_history(run_id, names[0])
    full_read = {**since(start), "points": len(full)}

    result: dict[str, Any] = {
        "mlflow": mlflow.__version__,
        "steps": args.steps,
        "fields": args.fields,
        "ingest": ingest,
        "sampled_read": sampled_read,
        "full_history": full_read,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
