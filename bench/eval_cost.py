"""What evaluation costs a training run beyond its own compute.

The same job trains twice, with evaluation off and with an evaluation every ``--every``
steps of ``--batches`` batches (default: every 100 steps, 20 batches), each run by
``Trainer.train`` as shipped in a thread of its own; the two take one step at a time in
turn (their ``should_stop`` polls hand the turn over), so drifting load on a shared machine
hits both alike, and each step is timed in the CPU time of the thread that trains it
(``time.thread_time``: on a CPU, with one intra-op thread, no prefetch and no sink, every
bit of a step's work runs there; process time would also charge whatever else the process
runs to the turn-holder). So is the time inside the evaluator (``Evaluator.run``, wrapped).
``--repeats`` such pairs, who goes first alternating.

Prints side by side, per training step: CPU time without evaluation, with it, and the
evaluations' own compute; and the ratio

    (with-eval overhead) / (time inside the evaluator)

which is ~1 when evaluation adds nothing but its compute (no extra host syncs, flushes or
slower steps after it). The overhead is taken where a hidden cost would be: the paired
differences of each evaluation step and of the ``AFTER`` steps after each, less what an
ordinary step of the with-eval run costs more anyway (the median paired difference of the
other steps, a steady offset between the two runs: cache and placement luck). An earlier
version multiplied the after-steps' median by their count without that correction and
printed "MET" over repeats of 0.60, 1.31 and 1.07.

The whole runs' totals ratio is printed too, judged the same way: on a CPU an evaluation
is a few percent of the run, within the jitter of 1,500 summed steps, so it says "cannot
decide" unless the machine is quiet. Every figure is judged by
:func:`bench.common.judge`: median, min..max over the repeats, and "cannot decide" when
the spread exceeds the margin to ``GOAL``.

    python bench/eval_cost.py [--steps 1500] [--repeats 3] [--every 100] [--batches 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.contract.spec import JobSpec, parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.evaluation import Evaluator
from bench.common import judge

GOAL = 1.1
"""(with-eval overhead) / (eval compute): at most this (1.0 is no hidden cost at all)."""
AFTER = 10
"""Steps after each evaluation counted with it (a cost it leaves behind: cold caches...)."""


class TimedEvaluator:
    """Wraps ``Evaluator.run`` to add up the CPU time of the (training) thread inside it."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.runs = 0
        self._original = Evaluator.run

    def __enter__(self) -> TimedEvaluator:
        original = self._original
        timer = self

        def run(evaluator: Evaluator, step: int) -> dict[str, float | None]:
            start = time.thread_time()
            try:
                return original(evaluator, step)
            finally:
                timer.cpu_s += time.thread_time() - start
                timer.runs += 1

        Evaluator.run = run  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        Evaluator.run = self._original  # type: ignore[method-assign]


def make_spec(args: argparse.Namespace, *, evaluate: bool) -> JobSpec:
    return parse_spec(
        {
            "name": "eval-cost",
            "model": {"name": "mlp", "args": {"width": args.width, "depth": 2}},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 64, "classes": 10},
            },
            "max_steps": args.steps,
            "batch_size": args.batch,
            "precision": args.precision,
            "device": "cpu",
            "telemetry": {"flush_every_steps": 10, "flush_every_ms": 500},
            # at_end off: the runs differ by the periodic evaluations alone.
            "eval": (
                {"every_steps": args.every, "batches": args.batches, "at_end": False}
                if evaluate
                else {"enabled": False}
            ),
        }
    )


class OneThreadTrainer(Trainer):
    """The engine as shipped, every batch built in the training thread when it is needed
    (as on a CPU by default; said here so the thread's CPU time is the whole step's)."""

    prefetch_depth = 0
    data_builders = 1


class Baton:
    """Lets two trainers, each in its own thread, take one step at a time in turn.

    Each one's ``should_stop`` (polled by ``Trainer.train`` at every step boundary) hands
    the turn over and waits for it back, so the two runs alternate step by step and machine
    load hits both alike; the CPU time of the turn-holder's thread is its step (its
    train_step, its evaluation when due, the loop around them)."""

    def __init__(self, first: int) -> None:
        self.turn = first
        self.done = [False, False]
        self.steps: list[list[float]] = [[], []]
        self._started = 0.0
        self._cv = threading.Condition()

    def begin(self, me: int) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self.turn == me)
            self._started = time.thread_time()

    def pass_on(self, me: int) -> None:
        """The end of ``me``'s turn: record it, hand over, wait for the next one."""
        with self._cv:
            self.steps[me].append(time.thread_time() - self._started)
            if not self.done[1 - me]:
                self.turn = 1 - me
                self._cv.notify_all()
                self._cv.wait_for(lambda: self.turn == me)
            self._started = time.thread_time()

    def finish(self, me: int) -> None:
        with self._cv:
            self.steps[me].append(time.thread_time() - self._started)
            self.done[me] = True
            self.turn = 1 - me
            self._cv.notify_all()


def paired_run(
    off: JobSpec, on: JobSpec, first: int
) -> tuple[list[float], list[float], float, int]:
    """One run of each, step by step in turn (``first``: 0 off, 1 on): per-step CPU s
    without and with evaluation, CPU s inside the evaluator, evaluations."""
    baton = Baton(first)
    errors: list[BaseException] = []

    def stop_poll(me: int) -> Callable[[], str | None]:
        def poll() -> None:
            baton.pass_on(me)

        return poll

    # Built off the clock, in this thread; each trains in its own, every batch built there.
    trainers = [
        OneThreadTrainer(spec, RunContext(None, should_stop=stop_poll(i)))
        for i, spec in enumerate((off, on))
    ]

    def train(me: int) -> None:
        baton.begin(me)
        try:
            trainers[me].train()
        except BaseException as exc:  # reported below, after both threads are done
            errors.append(exc)
        finally:
            baton.finish(me)

    with TimedEvaluator() as timer:
        threads = [threading.Thread(target=train, args=(i,), name=f"train-{i}") for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    if timer.runs != on.max_steps // on.eval.every_steps:
        raise SystemExit(f"{timer.runs} evaluations, expected every {on.eval.every_steps} steps")
    return baton.steps[0], baton.steps[1], timer.cpu_s, timer.runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind, interleaved")
    parser.add_argument("--every", type=int, default=100, help="evaluate every this many steps")
    parser.add_argument("--batches", type=int, default=20, help="batches per evaluation")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.every <= 0 or args.steps < args.every:
        parser.error("--every must be positive and at most --steps")
    torch.set_num_threads(args.threads)
    off, on = make_spec(args, evaluate=False), make_spec(args, evaluate=True)
    # Warm-up (lazy optimizer state, allocator, first calls): one evaluation's worth of steps.
    short = {"max_steps": args.every}
    paired_run(off.model_copy(update=short), on.model_copy(update=short), first=0)
    load = os.getloadavg()
    totals: list[tuple[float, float, float]] = []  # (CPU s off, on, inside the evaluator)
    ratios: list[float] = []  # of the runs' totals
    errors: list[float] = []  # their noise
    local: list[float] = []  # of the evaluation steps and the AFTER steps after each
    shifts: list[float] = []  # median paired difference of the other steps, s
    evaluations = 0
    for i in range(args.repeats):
        without, with_eval, inside, evaluations = paired_run(off, on, i % 2)
        totals.append((sum(without), sum(with_eval), inside))
        # Turn k is step k (turn 0: the run's setup), so diffs[k] is what step k cost more.
        diffs = [w - o for w, o in zip(with_eval, without, strict=True)]
        ratios.append(sum(diffs) / inside)
        # The noise of that sum: the step-to-step jitter of the paired steps, added up.
        errors.append(statistics.stdev(diffs) * math.sqrt(len(diffs)) / inside)
        at = set(range(args.every, args.steps + 1, args.every))
        after = {k + j for k in at for j in range(1, AFTER + 1)} & set(range(len(diffs)))
        # What any step of the with-eval run costs more: the steady offset, not evaluation's.
        shift = statistics.median(d for k, d in enumerate(diffs) if k and k not in at | after)
        counted = [diffs[k] - shift for k in sorted(at | after)]
        local.append(sum(counted) / inside)
        shifts.append(shift)
    per_step = 1000 / args.steps  # CPU s per run -> ms per step
    off_ms = statistics.median(t[0] for t in totals) * per_step
    on_ms = statistics.median(t[1] for t in totals) * per_step
    eval_s = statistics.median(t[2] for t in totals)
    eval_ms = eval_s * per_step
    error = statistics.median(errors) / math.sqrt(args.repeats)
    print(
        f"eval_cost: CPU, {args.threads} thread(s); precision={args.precision} "
        f"steps={args.steps} batch={args.batch} width={args.width}; eval every {args.every} "
        f"steps of {args.batches} batches ({evaluations} per run); repeats={args.repeats} "
        f"(the two runs of a repeat step in turn); load average {load[0]:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    print(" eval off, CPU s per run: " + " ".join(f"{t[0]:.3f}" for t in totals))
    print(" eval on,  CPU s per run: " + " ".join(f"{t[1]:.3f}" for t in totals))
    print(" inside the evaluator, s: " + " ".join(f"{t[2]:.3f}" for t in totals))
    print(
        f"per training step (training thread CPU, median): without eval {off_ms:.3f} ms | "
        f"with eval {on_ms:.3f} ms | the evaluations alone {eval_ms:.3f} ms "
        f"({eval_s / evaluations * 1000:.1f} ms per evaluation)"
    )
    verdict = judge(
        f"ratio (with-eval overhead)/(eval compute), evaluation steps and the {AFTER} after "
        "each, less the ordinary steps' offset",
        local,
        GOAL,
    )
    whole = judge("ratio of the whole runs' totals", ratios, GOAL)
    print(verdict.line())
    print(
        whole.line(digits=2)
        + f"; step jitter +- {error:.2f}; the other steps' median paired difference "
        f"{statistics.median(shifts) * 1e6:+.1f} us/step"
    )
    print(f"goal (ratio <= {GOAL}): {verdict.verdict.upper()}")
    if args.json:
        result: dict[str, Any] = {
            "args": vars(args),
            "cpu_s_runs": totals,
            "evaluations_per_run": evaluations,
            "step_ms_without": off_ms,
            "step_ms_with": on_ms,
            "step_ms_eval": eval_ms,
            "ratio": verdict.median,
            "ratios": local,
            "ratio_of_totals": ratios,
            "ratio_of_totals_error": error,
            "other_steps_shift_s": shifts,
            "goal": GOAL,
            "verdict": verdict.as_dict(),
            "whole_run_verdict": whole.as_dict(),
        }
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
