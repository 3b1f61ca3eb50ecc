"""A warm spare: the training process, started before its job is known.

``python -m amptrain.worker.child.spare PARENT_PID`` imports torch, the engine and the
built-in components while its pool slot waits for work, then blocks on stdin
for its :class:`~amptrain.worker.child.protocol.Launch`. It then runs that one attempt
exactly like a cold ``python -m amptrain.worker.child.main`` (:func:`amptrain.worker.child.main.serve`)
and exits: CUDA is first touched after the launch, so every job still gets a
fresh CUDA context, and a crash still ends only that job. Its telemetry sink
process (:class:`~amptrain.worker.child.sink_process.ProcessSink`) is started ahead too,
and likewise serves that one attempt only.

A spare that finds CUDA already initialised (a component module that touches
the GPU at import) refuses its launch by exiting before it answers
:class:`~amptrain.worker.child.protocol.Accepted`; the supervisor then starts a cold
process for the job. A spare whose stdin closes without a launch exits quietly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from amptrain.worker.child.main import cuda_initialized, die_with_parent, serve
from amptrain.worker.child.protocol import Launch

REFUSED = 3
"""Exit status of a spare that refused its launch (CUDA was initialised before it)."""


WARM_UP_JOB: dict[str, object] = {
    "model": {"name": "mlp", "args": {"width": 8, "depth": 1}},
    "dataset": {"name": "synthetic-classification", "args": {"features": 4}},
    "device": "cpu",
    "precision": "fp32",
    "max_steps": 2,
    "batch_size": 2,
}
"""A throwaway CPU run: the first model build, forward, backward and optimizer step of
a process import PyTorch's lazily loaded parts (the memory estimate's meta-device
kernels alone took 5 s here), which every job would otherwise wait for."""


def warm_up() -> None:
    """Import what every attempt needs (torch, the engine, each built-in component) and
    train :data:`WARM_UP_JOB` once, on the CPU: nothing here may touch CUDA."""
    from amptrain.contract import catalog
    from amptrain.contract.spec import parse_spec
    from amptrain.engine import RunContext, Trainer

    for kind in ("model", "dataset"):
        for registration in catalog.builtins(kind).values():
            registration.resolve_builder()
        catalog.plugin_entry_points(kind)  # reads installed metadata; loads no plugin code
    # Each job seeds every generator it uses itself (the determinism test compares a
    # warm run with a cold one), so this run leaves nothing a job could see.
    Trainer(parse_spec(WARM_UP_JOB), RunContext(checkpoint_dir=None, sink=None)).train()


def retitle(args: list[str]) -> None:
    """Show ``args`` as this process's command line (``ps``, ``/proc/PID/cmdline``), so a
    spare running a job reads as ``python -m amptrain.worker.child.main`` like a cold child.
    Linux only; best effort (the title is cosmetic, nothing depends on it here)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (man 5 proc)
        raw = "\0".join(args).encode()
        if len(raw) >= end - start:
            return
        # Pad the last argument with spaces, not NULs: tools would show empty arguments.
        raw = raw.ljust(end - start - 1, b" ") + b"\0"
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(raw)


def main() -> int:
    parent = int(sys.argv[1]) if len(sys.argv) > 1 else None
    die_with_parent()
    if parent is not None and os.getppid() != parent:
        return 0  # the pool process died before prctl took effect
    # Ctrl-C reaches the whole process group; an idle spare has nothing to save, but a
    # traceback from inside an import would only alarm whoever reads the log.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from amptrain.worker.child.sink_process import ProcessSink

    sink = ProcessSink.ahead()  # its start-up overlaps the warm-up
    warm_up()
    data = sys.stdin.read()
    if not data.strip():
        return 0  # retired without a job
    launch = Launch.model_validate_json(data)
    if cuda_initialized():
        print(
            f"warm spare {os.getpid()}: CUDA was initialised before the launch of job "
            f"{launch.job_id}; refusing it (the worker starts a fresh process)",
            file=sys.stderr,
        )
        return REFUSED
    retitle([sys.orig_argv[0], "-m", "amptrain.worker.child.main"])
    return serve(launch, warm=True, sink=sink)


if __name__ == "__main__":
    sys.exit(main())
