"""The Trainer: ``train`` -> ``train_step`` -> ``forward_backward`` (in
:class:`~amptrain.engine.amp_step.AmpStep`), plus the one place that acts on the guardian's
verdicts (:meth:`Trainer._act`). What it is built of: ``parts``; what it carries between
steps: :class:`~amptrain.engine.train_state.TrainState`; its checkpoints:
:class:`~amptrain.engine.checkpoint_manager.CheckpointManager`.

Between two telemetry flushes a step reads nothing from the device: the loss, the
gradient norm, fp16's skip flag and scale, the learning rate and the count of applied
steps all stay device tensors (see ``host``, ``lr_schedule`` and ``telemetry``), so
on a GPU the host runs ahead of the device by as many steps as the caching allocator
and the data path allow.

Every call that may flush telemetry returns the guardian's verdict on what it read; the
Trainer acts on it at the step boundary, never from inside a flush or an exception handler.
Before an evaluation or a checkpoint, telemetry is flushed and its verdict acted on first, so
neither ever sees weights that a rollback read later would throw away.

With ``devices`` > 1 each process runs this loop as one rank of a DDP group
(:mod:`~amptrain.engine.distributed`): rank r takes its contiguous share of every
global batch, gradients are all-reduced in the last micro-batch's backward, and rank 0
alone publishes telemetry and writes checkpoints (holding every rank's RNG state). Every
rank judges the same gathered records, so every rank acts on the same verdicts.
"""

from __future__ import annotations

import contextlib
import time

import torch

from amptrain.contract.errors import CancelledError, PreemptedError, TrainingError
from amptrain.contract.layout import checkpoint_name
from amptrain.contract.records import PRECISION_FALLBACK, ROLLBACK_EVENT
from amptrain.contract.spec import JobSpec
from amptrain.engine.context import Components, RunContext, TrainResult
from amptrain.engine.fallback import fallback_event
from amptrain.engine.guardian import (
    Continue,
    Diverged,
    FallBack,
    RollBack,
    Verdict,
    sooner,
)
from amptrain.engine.initial_weights import begin
from amptrain.engine.memory import release_cached, snapshot
from amptrain.engine.oom import is_out_of_memory, shrink
from amptrain.engine.parts import DataOptions, build
from amptrain.engine.rollback import rollback_event


class Trainer:
    """Runs one job spec to completion, or to a TrainingError: build it, then call
    :meth:`train` once. ``step``: the optimizer steps done so far (``ctx.should_stop`` may
    read it)."""

    drain_timeout_s: float = 10.0
    """How long :meth:`train` lets the publisher deliver queued telemetry at the end."""
    prefetch_depth: int | None = None
    data_builders: int | None = None
    read_later: bool | None = None
    """These three: see :class:`~amptrain.engine.parts.DataOptions`."""

    def __init__(
        self, spec: JobSpec, ctx: RunContext, components: Components | None = None
    ) -> None:
        self.spec = spec
        self.ctx = ctx
        data = DataOptions(self.prefetch_depth, self.data_builders, self.read_later)
        self.parts = parts = build(spec, ctx, components, data)
        self.device = parts.device
        self.group = parts.group
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.schedule = parts.schedule
        self.feeder = parts.feeder
        self.amp = parts.amp
        self.state = parts.state
        self.run_state = parts.run_state
        self.checkpoints = parts.checkpoints
        self.publisher = parts.publisher
        self.telemetry = parts.telemetry
        self.telemetry.judge = lambda reading: parts.guardian.judge(
            reading, self.state.situation(self.checkpoints.newest_healthy)
        )
        self.evaluator = parts.evaluator

    @property
    def step(self) -> int:
        return self.state.step

    def train(self) -> TrainResult:
        """Train up to ``spec.max_steps``; raises a TrainingError subclass when it cannot."""
        try:
            precision = self.parts.precision.to_dict()
            self._act(self.telemetry.event("precision", self.step, **precision))
            self._act(self._resume())
            while self.state.step < self.spec.max_steps:
                self._poll_stop()
                self._act(self.train_step())
                self._boundary(final=False)
            self._boundary(final=True)
            self._act(self.telemetry.flush())
        except BaseException:
            if not self.group.parallel:
                # The records of the steps that did finish; the failure is what the user sees.
                # Devices > 1: a flush is a collective the other ranks may never join.
                with contextlib.suppress(Exception):
                    self.telemetry.flush()
            raise
        finally:
            self.feeder.close()
            self.telemetry.close(self.drain_timeout_s)
            self.group.close()
            self.parts.restore_math()
        return self.parts.result()

    def train_step(self) -> Verdict:
        """One optimizer step over ``batch_size`` samples; the verdict on what its flushes read.

        An out-of-memory error in the forward, the backward or the optimizer step abandons
        the step (the spike window too) and, if allowed, runs it again with half the
        micro-batch once the exception (whose traceback holds its activations) is gone."""
        started = time.perf_counter()
        verdict: Verdict = Continue()
        while True:
            try:
                loss = self._accumulate()
                lr = self.schedule.lr
                applied = self.amp.apply(loss)
                break
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                if not is_out_of_memory(exc):
                    raise
            # Outside the except block: the exception and its frames are released by now.
            verdict = sooner(verdict, self._shrink_after_oom())
        self.schedule.advance(applied.withheld)
        self.state.step += 1
        values = {"loss": loss, "grad_norm": applied.grad_norm, "lr": lr}
        if applied.scale is not None and applied.found_inf is not None:  # fp16's scaler
            values.update(skipped=applied.found_inf, loss_scale=applied.scale)
        recorded = self.telemetry.record(
            self.state.step,
            values,
            samples=self.spec.batch_size,
            started=started,
            overflow=applied.overflow,
            spike=applied.spike,
            layers=self.parts.layer_norms.due(self.state.step, applied.norms),
        )
        return sooner(verdict, recorded)

    def save_checkpoint(self) -> Verdict:
        """Flush, then write a checkpoint of this step unless the flush's verdict asks for
        something first (for the caller to act on); the verdict. Telemetry first: a run
        resumed from it never re-runs the steps before it, so their records must be with the
        sink before it exists (a stuck sink delays it by at most ``drain_timeout_s``)."""
        verdict = self.telemetry.flush()
        if not (self.checkpoints.enabled and isinstance(verdict, Continue)):
            return verdict
        self.publisher.wait_delivered(self.drain_timeout_s)
        self.checkpoints.save(self.run_state.state_dict(healthy=self.parts.guardian.healthy))
        step = self.state.step  # the file's name, not the server's path: events reach users
        return self.telemetry.event("checkpoint", step, name=checkpoint_name(step))

    def _act(self, verdict: Verdict) -> None:
        """Carry out a verdict at this step boundary (the only place one is acted on)."""
        while not isinstance(verdict, Continue):
            if isinstance(verdict, Diverged):
                raise verdict.error()
            if isinstance(verdict, FallBack):
                # The next attempt resumes from the newest healthy one: nothing after it kept.
                resume_from = self.checkpoints.newest_healthy(verdict.step)
                self.checkpoints.discard_after(resume_from or 0)
                data = fallback_event(verdict, resume_from)
                self.telemetry.event(PRECISION_FALLBACK, verdict.step, **data)
                raise verdict.error()
            verdict = self._roll_back(verdict)

    def _roll_back(self, verdict: RollBack) -> Verdict:
        """The components back to the verdict's checkpoint (the train state stays: no step is
        recorded twice, the batches since are skipped), the event, a checkpoint of the
        rolled-back state at this step; the verdict of the flushes that took."""
        rule = self.spec.health.spike
        assert rule is not None
        at = self.state.step
        if verdict.checkpoint is not None:
            self.run_state.load_learned(self.checkpoints.load(verdict.checkpoint))
            self.state.rollbacks += 1
        self.state.rolled_back_at = at
        data = rollback_event(verdict, self.state, rule, directory=self.checkpoints.enabled)
        after = self.telemetry.event(ROLLBACK_EVENT, at, **data)
        # A run killed from here resumes rolled back, and never again for the same spike.
        return self.save_checkpoint() if isinstance(after, Continue) else after

    # -- internals ----------------------------------------------------------------------------

    def _boundary(self, *, final: bool) -> None:
        """After a step (``final``: after the last): evaluate and checkpoint when due, with
        every step so far judged and its verdict acted on first."""
        step = self.state.step
        last_eval = self.state.last_eval_step
        evaluate = self.evaluator is not None and self.evaluator.due(step, last_eval, final=final)
        if evaluate or final or self.checkpoints.due(step, final=final):
            self._act(self.telemetry.flush())
        if evaluate and self.evaluator is not None:
            values = self.evaluator.run(step)
            self.state.last_eval_step = step
            # Through the flush: the sink gets it after the metrics of every step up to this one.
            self._act(self.telemetry.flush(self.evaluator.records(step, values)))
        if self.checkpoints.due(step, final=final):  # not if a rollback just acted on wrote it
            self._act(self.save_checkpoint())

    def _resume(self) -> Verdict:
        start = begin(self.checkpoints, self.run_state, self.ctx, self.model, self.spec.weights)
        if start.event is None:
            return Continue()
        verdict = self.telemetry.event(start.event, start.step, **start.data)
        if start.checkpoint_now and isinstance(verdict, Continue):
            return start.kept(self.save_checkpoint(), self.checkpoints, self.group.leader)
        return verdict

    def _accumulate(self) -> torch.Tensor:
        """All micro-batches of the step; returns the mean loss (device tensor)."""
        self.optimizer.zero_grad(set_to_none=True)
        micro, accum = self.state.micro_batch, self.state.grad_accum
        # Rank r's contiguous share of the global batch: resume needs no sampler state.
        start = self.state.samples_consumed + self.group.rank * micro * accum
        total: torch.Tensor | None = None
        for i in range(accum):
            inputs, targets = self.feeder.get(start + i * micro, micro)
            loss = self.amp.forward_backward(inputs, targets, accum, last=i == accum - 1)
            total = loss if total is None else total + loss
        assert total is not None
        return total / accum if accum > 1 else total

    def _shrink_after_oom(self) -> Verdict:
        """Halve the micro-batch (doubling accumulation) or raise OutOfMemoryError."""
        self.amp.abandon()
        self.feeder.reset()
        peak = snapshot(self.device).peak
        release_cached(self.device)
        data = shrink(self.spec, self.state, peak)
        return self.telemetry.event("micro_batch", self.state.step, **data)

    def _poll_stop(self) -> None:
        reason = self.telemetry.ranks.agree(self.ctx.should_stop())
        if reason is None:
            return
        self._act(self.save_checkpoint())
        raise _stopped(reason, self.state.step)


def _stopped(reason: str, step: int) -> TrainingError:
    if reason == "preempt":
        return PreemptedError(f"preempted at step {step}; checkpointed, resumable", step=step)
    return CancelledError(f"cancelled at step {step}", step=step)
