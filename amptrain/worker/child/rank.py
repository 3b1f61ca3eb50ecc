"""One rank of a data-parallel attempt, started by torchrun: ``python -m amptrain.worker.child.rank DIR``.

The supervisor starts ``K`` of these through :mod:`amptrain.worker.child.launcher`
(torchrun) and talks to them through the attempt's :class:`~amptrain.worker.child.run_dir.RunDir`
``DIR``: each rank reads the launch there, says its pid there before it trains, and
writes how it ended there (files named by its rank on this node); the world's rank 0 alone publishes telemetry and appends the control
messages (accepted, precision) the single-process child sends on its pipe. Stop signals
are those of :mod:`amptrain.worker.child.main` (SIGUSR1 cancel; SIGUSR2/SIGTERM preempt); the
engine makes the ranks agree on a stop at a flush, so signalling any one rank stops all.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from amptrain.core.lifeline import ORPHANED, die_with, leave_process_group
from amptrain.worker.child.launcher import LAUNCHER_PID_ENV
from amptrain.worker.child.main import (
    Control,
    ControlledSink,
    catch_stop_signals,
    cuda_initialized,
    train,
)
from amptrain.worker.child.protocol import Accepted, Failed, Finished, Launch, encode
from amptrain.worker.child.run_dir import RunDir


def add_nccl_defaults(env: MutableMapping[str, str], defaults: Mapping[str, str]) -> None:
    """This process is the rank: its environment is the launcher's to complete before the
    engine builds the process group (ProcessGroupNCCL reads it then); values the operator
    set win."""
    for key, value in defaults.items():
        env.setdefault(key, value)


def train_rank(launch: Launch, control: Control | None) -> Finished | Failed:
    """Train this rank's part of ``launch``; how it ended. ``control``: rank 0's, the one
    rank that publishes telemetry (None on the others)."""
    from amptrain.engine.distributed import NCCL_DEFAULTS, Ranks
    from amptrain.worker.child.sink_process import ProcessSink

    add_nccl_defaults(os.environ, NCCL_DEFAULTS)
    sink: ControlledSink | None = None
    if control is not None:
        sink = ControlledSink(ProcessSink(launch.redis_url, launch.job_id, launch.attempt), control)
    return train(launch, sink, Ranks.from_env(os.environ))


def main(argv: list[str]) -> int:
    catch_stop_signals()  # a cancel stays a cancel when torchrun's SIGTERM follows it
    if not die_with(int(os.environ.get(LAUNCHER_PID_ENV, "-1"))):
        return ORPHANED  # the launcher is gone: nobody would stop this rank
    run_dir = RunDir(Path(argv[0]))
    # Files are per node (LOCAL_RANK); the one publisher is the world's rank 0, which on a
    # multi-node attempt may live on any node (c10d decides).
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    launch = Launch.model_validate_json(run_dir.launch.read_text(encoding="utf-8"))
    info = {
        "rank": rank,
        "local_rank": local,
        "pid": os.getpid(),
        "master_port": os.environ.get("MASTER_PORT"),
    }
    run_dir.write_atomic(run_dir.rank_info(local), json.dumps(info))
    if rank == 0:
        with run_dir.control.open("a", encoding="utf-8") as stream:
            control = Control(stream)
            control.send(Accepted(pid=os.getpid(), warm=False, cuda_initialized=cuda_initialized()))
            outcome = train_rank(launch, control)
    else:
        outcome = train_rank(launch, None)
    run_dir.write_atomic(run_dir.result(local), encode(outcome))
    # A stop on request (cancel, preempt) checkpointed: not a failure for torchrun either.
    stopped = isinstance(outcome, Failed) and outcome.code in ("cancelled", "preempted")
    return 0 if isinstance(outcome, Finished) or stopped else 1


if __name__ == "__main__":
    leave_process_group(main(sys.argv[1:]))
