"""One rank of a data-parallel attempt, started by torchrun: ``python -m amptrain.worker.child.rank DIR``.

The supervisor starts ``K`` of these through :mod:`amptrain.worker.child.launcher`
(torchrun) and talks to them through the attempt's :class:`~amptrain.worker.child.run_dir.RunDir`
``DIR``: each rank reads the launch there, says its pid there before it trains, and
writes how it ended there; rank 0 alone publishes telemetry and appends the control
messages (accepted, precision) the single-process child sends on its pipe. Stop signals
are those of :mod:`amptrain.worker.child.main` (SIGUSR1 cancel; SIGUSR2/SIGTERM preempt); the
engine makes the ranks agree on a stop at a flush, so signalling any one rank stops all.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from amptrain.contract.errors import TrainingError, classify_failure
from amptrain.worker.child.launcher import LAUNCHER_PID_ENV, ORPHANED, die_with
from amptrain.worker.child.main import Control, ControlledSink, cuda_initialized
from amptrain.worker.child.protocol import Accepted, Failed, Finished, Launch, encode
from amptrain.worker.child.run_dir import RunDir

_stop_request: str | None = None


def _on_signal(signum: int, frame: object) -> None:
    global _stop_request
    if _stop_request is None:  # a cancel stays a cancel when torchrun's SIGTERM follows it
        _stop_request = "cancel" if signum == signal.SIGUSR1 else "preempt"


def add_nccl_defaults(env: MutableMapping[str, str], defaults: Mapping[str, str]) -> None:
    """This process is the rank: its environment is the launcher's to complete before the
    engine builds the process group (ProcessGroupNCCL reads it then); values the operator
    set win."""
    for key, value in defaults.items():
        env.setdefault(key, value)


def train(launch: Launch, rank: int, control: Control | None) -> Finished | Failed:
    """Train this rank's part of ``launch``; how it ended."""
    from amptrain.contract.spec import parse_spec
    from amptrain.engine import RunContext, Trainer
    from amptrain.engine.distributed import NCCL_DEFAULTS, Ranks
    from amptrain.worker.child.main import _probe
    from amptrain.worker.child.sink_process import ProcessSink

    add_nccl_defaults(os.environ, NCCL_DEFAULTS)
    sink: Any = None
    if control is not None:  # rank 0: the one that publishes
        sink = ControlledSink(ProcessSink(launch.redis_url, launch.job_id, launch.attempt), control)
    try:
        ctx = RunContext(
            checkpoint_dir=launch.checkpoint_dir,
            sink=sink,
            data_roots=launch.data_roots,
            should_stop=lambda: _stop_request,
            resume=True,
            cpu_bf16_probe=_probe(launch.cpu_bf16_probe),
            ranks=Ranks.from_env(os.environ),
        )
        result = Trainer(parse_spec(launch.spec), ctx).train()
    except Exception as exc:
        if not isinstance(exc, TrainingError):
            traceback.print_exc()  # for the operator; the user sees the classified error
        error = classify_failure(exc)
        return Failed(
            code=error.code, message=error.message, step=error.step, retryable=error.retryable
        )
    finally:
        if sink is not None:
            sink.close()
    return Finished(
        final_step=result.final_step,
        resumed_from=result.resumed_from,
        skipped_steps=result.skipped_steps,
        dropped_records=result.dropped_records,
    )


def main(argv: list[str]) -> int:
    # Ctrl-C reaches the group; the supervisor decides how training stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    if not die_with(int(os.environ.get(LAUNCHER_PID_ENV, "-1"))):
        return ORPHANED  # the launcher is gone: nobody would stop this rank
    run_dir = RunDir(Path(argv[0]))
    rank = int(os.environ["RANK"])
    launch = Launch.model_validate_json(run_dir.launch.read_text(encoding="utf-8"))
    info = {"rank": rank, "pid": os.getpid(), "master_port": os.environ.get("MASTER_PORT")}
    run_dir.write_atomic(run_dir.rank_info(rank), json.dumps(info))
    if rank == 0:
        with run_dir.control.open("a", encoding="utf-8") as stream:
            control = Control(stream)
            control.send(Accepted(pid=os.getpid(), warm=False, cuda_initialized=cuda_initialized()))
            outcome = train(launch, rank, control)
    else:
        outcome = train(launch, rank, None)
    run_dir.write_atomic(run_dir.result(rank), encode(outcome))
    # A stop on request (cancel, preempt) checkpointed: not a failure for torchrun either.
    stopped = isinstance(outcome, Failed) and outcome.code in ("cancelled", "preempted")
    return 0 if isinstance(outcome, Finished) or stopped else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
