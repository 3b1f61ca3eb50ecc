"""``amptrain train SPEC``: train a job spec on this machine, without any server.

Records (one JSON object per line, metrics and events alike, the same dicts the
service streams) go to ``--out`` or stdout; the progress bar and messages go to
stderr, so ``amptrain train spec.yaml > records.jsonl`` works. Exit status: 0
done, 1 the run failed (the error's code and message are printed), 2 the spec
is invalid (each problem printed with its field), 130 interrupted (Ctrl-C asks
the engine to stop cleanly; with ``--checkpoint-dir`` it checkpoints first and
the same command resumes).

A spec with ``devices: K`` > 1 runs as K processes started by torchrun, each running
this module as one rank. torchrun speaks only through the environment: its ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` reach this command as the options ``--rank``,
``--world-size`` and ``--local-rank`` (click reads them; nothing here reads the
environment), and ``MASTER_ADDR``/``MASTER_PORT`` reach torch itself::

    TORCH_NCCL_DUMP_ON_TIMEOUT=1 python -m torch.distributed.run --standalone --nnodes 1 \
        --nproc-per-node K --max-restarts 0 -m amptrain.cli.train SPEC --checkpoint-dir DIR

(NCCL's failure settings, :data:`amptrain.engine.distributed.NCCL_DEFAULTS`, are the
launcher's to set: the worker sets them for its ranks.)

Rank 0 writes the records and the progress; the other ranks print only their errors.
``--result-file`` (``{rank}`` is replaced by the rank) gets each rank's outcome as JSON.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Any

import click
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from amptrain.client.event_lines import event_line
from amptrain.client.progress_bar import StatsProgress, placed
from amptrain.contract.catalog import validate_components, validate_refs
from amptrain.contract.errors import TrainingError, classify_failure
from amptrain.contract.layers import layer_line
from amptrain.contract.metrics import show
from amptrain.contract.progress import LAST_LOSS_LABEL, ProgressView, progress_line
from amptrain.contract.records import ROLLBACK_EVENT
from amptrain.contract.spec import ComponentRef, JobSpec, parse_spec
from amptrain.contract.spec_file import load_spec_file
from amptrain.core.lifeline import leave_process_group

EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_INTERRUPTED = 130


def _ref(data: dict[str, Any], key: str) -> ComponentRef | None:
    try:
        return ComponentRef.model_validate(data.get(key))
    except ValidationError:
        return None


def _loc(loc: Any) -> str:
    return ".".join(map(str, loc)) or "(spec)"


def spec_problems(data: dict[str, Any]) -> tuple[JobSpec | None, list[str]]:
    """The validated spec, or every problem as ``"field.path: message"``."""
    try:
        spec = parse_spec(data)
    except ValidationError as exc:
        problems = [f"{_loc(e['loc'])}: {e['msg']}" for e in exc.errors()]
        # Report unknown components and bad arguments in the same pass.
        problems += [
            f"{_loc(e['loc'])}: {e['msg']}"
            for e in validate_refs(_ref(data, "model"), _ref(data, "dataset"))
        ]
        return None, problems
    problems = [f"{_loc(e['loc'])}: {e['msg']}" for e in validate_components(spec)]
    return (None if problems else spec), problems


class ConsoleSink:
    """Writes every record as a JSON line and drives the progress bar.

    Runs on the engine's publisher thread, never the training thread.
    """

    def __init__(self, out: IO[str], progress: Progress, task: Any, console: Console) -> None:
        self.out = out
        self.progress = progress
        self.task = task
        self.console = console
        self.last_metric: dict[str, Any] | None = None
        self.view = ProgressView()  # smoothed loss, steady-state samples/s

    def write(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.out.write(json.dumps(item, separators=(",", ":")) + "\n")
            if item["kind"] == "event":
                self._show_event(item)
            elif item["kind"] == "eval":
                self.console.print(eval_line(item), markup=False)
            elif item["kind"] == "layer_grad_norm":
                line = layer_line(item["step"], item["values"], self.console.width)
                self.console.print(line, markup=False)
            else:
                self.last_metric = self.view.add(item)
        self.out.flush()
        if self.last_metric is not None:
            m = self.last_metric
            stats = functools.partial(progress_line, m, smoothed_loss=True)
            width = self.console.width
            fields = placed(stats, width - _FIXED_COLUMNS, width)
            self.progress.update(self.task, completed=m["step"], **fields)

    def _show_event(self, item: dict[str, Any]) -> None:
        data = item["data"]
        if item["type"] in ("warning", ROLLBACK_EVENT):  # as `watch` prints them: the step once
            self.console.print(event_line(item, self.console.width), soft_wrap=True)
        elif item["type"] == "precision":
            self.console.print(
                f"precision: {data['effective']} on {data['device']} (requested {data['requested']}: {data['reason']})",
                markup=False,
            )
        elif item["type"] == "resumed":
            self.console.print(f"resumed from step {data.get('from_step', item['step'])}")
        elif item["type"] == "micro_batch":
            self.console.print(f"[yellow]micro-batch halved[/]: {escape(str(data))}")

    def close(self) -> None:
        self.out.flush()


def eval_line(item: dict[str, Any]) -> str:
    """``eval step 40: eval_loss 0.4121, accuracy 0.9120`` (null: a value that was not finite)."""
    shown = ", ".join(
        f"{name} {'null' if value is None else f'{value:.4f}'}"
        for name, value in item["values"].items()
    )
    return f"eval step {item['step']}: {shown}"


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """Ctrl-C (and SIGTERM) ask the engine to stop at the next step boundary."""
    requested = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if requested.is_set():  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        requested.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


_FIXED_COLUMNS = 50
"""What the progress bar's other columns take of a line (label, bar, steps, time left)."""


def _progress(console: Console, total: int) -> tuple[Progress, Any]:
    progress = StatsProgress(
        TextColumn("[bold]train"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
    )
    return progress, progress.add_task("train", total=total, stats="", below="")


class RankResult:
    """``--result-file``: how this rank's run ended, as one JSON object."""

    def __init__(self, pattern: Path | None, rank: int, world_size: int) -> None:
        self.path = Path(str(pattern).replace("{rank}", str(rank))) if pattern else None
        self.head = {"rank": rank, "world_size": world_size}

    def write(self, **outcome: Any) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps({**self.head, **outcome}, default=str) + "\n")


def run(
    spec: JobSpec,
    out: IO[str] | None,
    console: Console,
    checkpoint_dir: str | None,
    data_roots: tuple[str, ...],
    resume: bool,
    result_file: Path | None = None,
    place: tuple[int, int, int] | None = None,
    weights_roots: tuple[str, ...] = (),
) -> int:
    """Train ``spec``; returns the exit status. ``out`` None: a rank > 0 (writes no records).
    ``place``: (rank, world size, local rank) under torchrun, else None."""
    from amptrain.engine import RunContext, Trainer  # torch: only once the spec is valid
    from amptrain.engine.distributed import Ranks

    ranks = Ranks(*place) if place is not None else None
    rank = ranks.rank if ranks else 0
    report = RankResult(result_file, rank, ranks.world_size if ranks else 1)
    progress, task = _progress(console, spec.max_steps)
    progress.disable = out is None
    sink = ConsoleSink(out, progress, task, console) if out is not None else None
    who = f"rank {rank}: " if rank else ""
    with _stop_on_signals() as stop, progress:
        ctx = RunContext(
            checkpoint_dir=checkpoint_dir,
            sink=sink,
            data_roots=data_roots,
            weights_roots=weights_roots,
            should_stop=lambda: "cancel" if stop.is_set() else None,
            resume=resume,
            ranks=ranks,
        )
        trainer = None
        try:
            try:
                trainer = Trainer(spec, ctx)
                result = trainer.train()
            except RuntimeError as raw:
                # What the worker would classify (an op deterministic mode refuses, an
                # allocation failure) is shown as such here too; the rest stays a bug.
                known = classify_failure(raw)
                if known.code == TrainingError.code:
                    raise
                raise known from raw
        except TrainingError as exc:
            where = f" at step {exc.step}" if exc.step is not None else ""
            console.print(
                f"{who}[red]error[/] \\[{exc.code}]{where}: {escape(exc.message)}", soft_wrap=True
            )
            seen = trainer.telemetry if trainer is not None else None
            report.write(
                status="failed",
                error={**exc.to_dict(), "retryable": exc.retryable},
                skipped_steps=seen.skipped_steps if seen else 0,
                last_record=seen.last_record if seen else None,
            )
            return EXIT_INTERRUPTED if stop.is_set() else EXIT_FAILED
        except Exception as exc:  # a bug, not a training outcome: keep the traceback visible
            console.print_exception()
            console.print(f"{who}[red]error[/] \\[internal]: {escape(repr(exc))}", soft_wrap=True)
            report.write(status="failed", error={"code": "internal", "retryable": True})
            return EXIT_FAILED
        finally:
            if sink is not None:
                sink.close()
    report.write(
        status="succeeded",
        final_step=result.final_step,
        resumed_from=result.resumed_from,
        skipped_steps=result.skipped_steps,
        dropped_records=result.dropped_records,
        precision=result.precision.to_dict(),
        last_record=result.last_record,
    )
    if out is None:
        return 0
    last = result.last_record or {}
    console.print(
        f"done: {result.final_step} steps, {result.precision.effective}, "
        f"{show('loss', last.get('loss')).replace('loss', LAST_LOSS_LABEL, 1)}, "
        f"{result.skipped_steps} skipped steps"
        + (f", {result.dropped_records} records dropped" if result.dropped_records else "")
    )
    return 0


@click.command("train")
@click.argument(
    "spec_path", metavar="SPEC", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write records as JSON lines here (default: stdout).",
)
@click.option(
    "--checkpoint-dir",
    help="Directory or fsspec URL for checkpoints; a rerun resumes from the newest.",
)
@click.option(
    "--data-root",
    "data_roots",
    multiple=True,
    help="Allow file datasets under this directory or URL (repeatable).",
)
@click.option(
    "--weights-root",
    "weights_roots",
    multiple=True,
    help="Allow the spec's weights.path (safetensors) under this directory (repeatable).",
)
@click.option("--no-resume", is_flag=True, help="Ignore existing checkpoints in --checkpoint-dir.")
@click.option("--rank", type=click.IntRange(0, 7), envvar="RANK", help="Set by torchrun.")
@click.option(
    "--world-size", type=click.IntRange(1, 8), envvar="WORLD_SIZE", help="Set by torchrun."
)
@click.option(
    "--local-rank", type=click.IntRange(0, 7), envvar="LOCAL_RANK", help="Set by torchrun."
)
@click.option(
    "--result-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write how the run ended here as JSON ({rank} is replaced by the rank).",
)
def train(
    spec_path: Path,
    out: Path | None,
    checkpoint_dir: str | None,
    data_roots: tuple[str, ...],
    no_resume: bool,
    result_file: Path | None = None,
    weights_roots: tuple[str, ...] = (),
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
) -> None:
    """Train the job SPEC (.json, .yaml or .yml) here, without any server."""
    console = Console(stderr=True)
    try:
        data = load_spec_file(spec_path)
    except (ValueError, yaml.YAMLError) as exc:
        console.print(
            f"[red]error[/] \\[invalid_spec]: cannot read {escape(str(spec_path))}: {escape(str(exc))}",
            soft_wrap=True,
        )
        sys.exit(EXIT_INVALID)
    spec, problems = spec_problems(data)
    if spec is None:
        console.print(
            f"[red]error[/] \\[invalid_spec]: {escape(str(spec_path))} has {len(problems)} problem(s):",
            soft_wrap=True,
        )
        for problem in problems:
            console.print(f"  {problem}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_INVALID)
    place = (rank or 0, world_size, local_rank or 0) if world_size is not None else None
    args = (console, checkpoint_dir, data_roots, not no_resume, result_file, place, weights_roots)
    if rank:  # a data-parallel rank > 0: rank 0 writes the records
        status = run(spec, None, *args)
    elif out is None:
        status = run(spec, sys.stdout, *args)
    else:
        with out.open("w") as f:
            status = run(spec, f, *args)
    if world_size is not None and world_size > 1:
        leave_process_group(status)
    sys.exit(status)


if __name__ == "__main__":  # python -m amptrain.cli.train SPEC: one rank under torchrun
    train()
