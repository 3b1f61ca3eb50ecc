"""The training child: one fresh interpreter per attempt, so CUDA never crosses a fork.

The supervisor starts ``python -m amptrain.worker.child.main`` with its launch parameters on
stdin and a pipe for control messages (:mod:`amptrain.worker.child.protocol`): that it
accepted the launch, the precision it chose, and how the run ended. (A warm spare,
:mod:`amptrain.worker.child.spare`, is the same process started before its job: it imports
torch first and reads its launch later, then runs :func:`serve`.) SIGUSR1 asks it to
cancel, SIGUSR2 (or SIGTERM) to checkpoint and stop for a shutdown; all take effect at the
next step boundary. SIGKILL is the supervisor's last resort.

:func:`train` is the one way an attempt trains: each rank of a data-parallel attempt
(:mod:`amptrain.worker.child.rank`) runs it too, with the same stop signals.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import MutableMapping
from typing import IO, TYPE_CHECKING, Any, Protocol

from amptrain.contract.errors import PrecisionFallbackError, TrainingError, classify_failure
from amptrain.contract.records import Sink
from amptrain.core.lifeline import die_with
from amptrain.worker.child.protocol import (
    Accepted,
    ControlMessage,
    Failed,
    Finished,
    Launch,
    PrecisionChosen,
    encode,
)

if TYPE_CHECKING:  # torch and Redis: only once a launch is in hand
    from amptrain.engine.context import ForkOrigin
    from amptrain.engine.distributed import Ranks
    from amptrain.worker.child.sink_process import ProcessSink


class Control:
    """The child's end of the control pipe."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def send(self, message: ControlMessage) -> None:
        self.stream.write(encode(message))
        self.stream.flush()


class ControlledSink:
    """Publishes telemetry to Redis; the precision decision goes to the supervisor instead,
    which records it (fenced) with the ``started`` event."""

    def __init__(self, inner: DeliveringSink, control: Control) -> None:
        self.inner = inner
        self.control = control

    def write(self, items: list[dict[str, Any]]) -> None:
        rest = []
        for item in items:
            if item.get("kind") == "event" and item.get("type") == "precision":
                self.control.send(PrecisionChosen(**item["data"]))
            else:
                rest.append(item)
        if rest:
            self.inner.write(rest)

    def close(self, timeout: float = 30.0) -> None:
        self.inner.close(timeout)


class DeliveringSink(Sink, Protocol):
    """A sink whose close keeps delivering what it holds for up to ``timeout`` seconds."""

    def close(self, timeout: float = 30.0) -> None: ...


FAILED_RANK_SINK_CLOSE_S = 5.0
"""How long a failed rank of a multi-process run keeps delivering at its end. Its peers
end at the collective timeout; a rank cut off from Redis with its host's cable would wait
the full 30 s here, and the attempt would end that much later on its node. Nothing is lost
by giving up: a retry resumes only from a checkpoint whose steps were recorded."""


_stop_request: str | None = None


def _on_signal(signum: int, frame: object) -> None:
    global _stop_request
    if _stop_request is None:  # a cancel stays a cancel when SIGTERM follows it
        _stop_request = "cancel" if signum == signal.SIGUSR1 else "preempt"


def catch_stop_signals() -> None:
    """SIGUSR1 asks to cancel, SIGUSR2 or SIGTERM to checkpoint and stop (a shutdown, or
    torchrun passing one on); all take effect at the next step boundary. Ctrl-C reaches
    the whole process group, but the supervisor decides how training stops (checkpoint
    first), so the training process ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(signum, _on_signal)


def train(launch: Launch, sink: Sink | None, ranks: Ranks | None = None) -> Finished | Failed:
    """Train ``launch`` until it ends or a stop signal (:func:`catch_stop_signals`) stops it;
    how it ended. Its telemetry goes to ``sink`` (None: a rank that does not publish), which
    is closed at the end; ``ranks``: this process's place in a data-parallel run."""
    from amptrain.contract.spec import parse_spec
    from amptrain.engine import RunContext, Trainer
    from amptrain.engine.cpu_probe import Bf16Probe
    from amptrain.worker.child.precision_cache import FileCache

    probe = launch.cpu_bf16_probe
    failed = False
    try:
        spec = parse_spec(launch.spec)
        if spec.deterministic:
            add_deterministic_env(os.environ)
        ctx = RunContext(
            checkpoint_dir=launch.checkpoint_dir,
            sink=sink,
            data_roots=launch.data_roots,
            weights_roots=launch.weights_roots,
            should_stop=lambda: _stop_request,
            resume=True,
            attempt=launch.attempt,
            recorded=launch.recorded,
            cpu_bf16_probe=Bf16Probe.from_dict(probe) if probe else None,
            precision_cache=FileCache(launch.precision_cache) if launch.precision_cache else None,
            ranks=ranks,
            precision_override=launch.precision_override,
            fork=fork_origin(launch),
        )
        result = Trainer(spec, ctx).train()
    except Exception as exc:
        failed = True
        if not isinstance(exc, TrainingError):
            # The user sees a class and a clean message; the operator gets the traceback,
            # whose text may quote data or the worker's paths.
            traceback.print_exc()
        error = classify_failure(exc)
        return Failed(
            code=error.code,
            message=error.message,
            step=error.step,
            retryable=error.retryable,
            fallback_to=error.fallback_to if isinstance(error, PrecisionFallbackError) else None,
        )
    finally:
        # The engine never closes the caller's sink: deliver what Redis has not taken yet.
        if isinstance(sink, ControlledSink) and failed and ranks is not None:
            sink.close(FAILED_RANK_SINK_CLOSE_S)
        elif sink is not None:
            sink.close()
    return Finished(
        final_step=result.final_step,
        resumed_from=result.resumed_from,
        skipped_steps=result.skipped_steps,
        dropped_records=result.dropped_records,
    )


def fork_origin(launch: Launch) -> ForkOrigin | None:
    """The engine's view of a fork's first state (None for any other job)."""
    from amptrain.engine.context import ForkOrigin

    fork = launch.fork
    if fork is None:
        return None
    return ForkOrigin(fork.checkpoint_dir, fork.step, fork.parent, launch.job_id)


def add_deterministic_env(env: MutableMapping[str, str]) -> None:
    """A ``deterministic`` job's process environment, completed before its Trainer exists:
    torch checks ``CUBLAS_WORKSPACE_CONFIG`` at the process's first cuBLAS call, once, and
    the engine reads and writes no environment. In time for every attempt: each is a fresh
    process (a warm spare touches no CUDA before its launch), and each rank of a
    data-parallel attempt runs :func:`train` too. A deterministic value the operator set
    (``:16:8``, the smaller workspace) is kept."""
    from amptrain.engine.precision import CUBLAS_WORKSPACE_CONFIG, DETERMINISTIC_CUBLAS_CONFIGS

    if env.get("CUBLAS_WORKSPACE_CONFIG") not in DETERMINISTIC_CUBLAS_CONFIGS:
        env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG


def run(launch: Launch, control: Control, ahead: ProcessSink | None = None) -> int:
    """Train ``launch``, its telemetry through a sink process (``ahead``: the one a warm
    spare started before its launch; None: start one now); the exit status."""
    # Redis I/O runs in a sink process of its own: out of the training process's GIL.
    outcome = train(launch, ControlledSink(_open_sink(launch, ahead), control))
    control.send(outcome)
    return 0 if isinstance(outcome, Finished) else 1


def _open_sink(launch: Launch, ahead: ProcessSink | None) -> ProcessSink:
    """This attempt's sink: the one started ahead if it still lives, else a new one."""
    from amptrain.worker.child.sink_process import ProcessSink

    if ahead is not None:
        try:
            return ahead.open(launch.redis_url, launch.job_id, launch.attempt)
        except OSError:
            ahead.close(0)  # it died while the spare waited: reap it
    return ProcessSink(launch.redis_url, launch.job_id, launch.attempt)


def die_with_parent() -> None:
    """If the supervisor dies (kill -9, OOM killer), the child dies too instead of training
    on unsupervised; the job's lease then expires and another worker resumes it."""
    die_with(os.getppid())


def main() -> int:
    launch = Launch.model_validate_json(sys.stdin.read())
    die_with_parent()
    return serve(launch, warm=False)


def serve(launch: Launch, *, warm: bool, sink: ProcessSink | None = None) -> int:
    """Train ``launch``, reporting on its control pipe; the exit status of the process.
    ``sink``: the sink process a warm spare started ahead (None: start one)."""
    # SIGTERM to the whole process group (systemd, `kill` of the group) means shutdown:
    # checkpoint at the next step boundary, like a drain. SIGKILL remains the hard stop.
    catch_stop_signals()
    with os.fdopen(launch.control_fd, "w", encoding="utf-8") as stream:
        control = Control(stream)
        control.send(Accepted(pid=os.getpid(), warm=warm, cuda_initialized=cuda_initialized()))
        return run(launch, control, sink)


def cuda_initialized() -> bool:
    """Whether this process has a CUDA context already (without importing torch to ask)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


if __name__ == "__main__":
    sys.exit(main())
