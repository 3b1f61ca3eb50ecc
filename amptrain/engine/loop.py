"""The Trainer: train -> train_step -> forward_backward, stop requests and OOM (what it is
built of: ``parts``; its checkpointed state: ``resume``).

Between two telemetry flushes a step reads nothing from the device: the loss, the
gradient norm, fp16's skip flag and scale, the learning rate and the count of applied
steps all stay device tensors (see ``host``, ``lr_schedule`` and ``telemetry``), so
on a GPU the host runs ahead of the device by as many steps as the caching allocator
and the data path allow.

With ``devices`` > 1 each process runs this loop as one rank of a DDP group
(:mod:`~amptrain.engine.distributed`): rank r takes its contiguous share of every
global batch, gradients are all-reduced in the last micro-batch's backward, and rank 0
alone publishes telemetry and writes checkpoints (holding every rank's RNG state).
"""

from __future__ import annotations

import contextlib
import time

import torch

from amptrain.contract import records
from amptrain.contract.errors import CancelledError, PrecisionFallbackError, PreemptedError
from amptrain.contract.records import PRECISION_FALLBACK
from amptrain.contract.spec import JobSpec
from amptrain.engine.context import Components, RunContext, TrainResult
from amptrain.engine.distributed import Group, check_launch, rank_device
from amptrain.engine.fallback import leave_fp16
from amptrain.engine.layer_norms import LayerNorms
from amptrain.engine.memory import format_bytes, release_cached, snapshot
from amptrain.engine.oom import is_out_of_memory, smaller_micro_batch
from amptrain.engine.parts import DataOptions, build_parts
from amptrain.engine.precision import resolve_device
from amptrain.engine.resume import Checkpointing
from amptrain.engine.rollback import roll_back
from amptrain.engine.spikes import RollbackRequested
from amptrain.engine.telemetry import StepTelemetry


class Trainer(Checkpointing):
    """Runs one job spec to completion, or to a TrainingError.

    Build it, then call :meth:`train` once. ``step`` is the number of optimizer
    steps done so far (it may be read from ``ctx.should_stop`` callbacks).
    """

    drain_timeout_s: float = 10.0
    """How long :meth:`train` lets the publisher deliver queued telemetry at the end."""
    prefetch_depth: int | None = None
    """See :attr:`~amptrain.engine.parts.DataOptions.prefetch_depth`."""
    data_builders: int | None = None
    """See :attr:`~amptrain.engine.parts.DataOptions.builders`."""

    def __init__(
        self, spec: JobSpec, ctx: RunContext, components: Components | None = None
    ) -> None:
        self.spec = spec
        self.ctx = ctx
        check_launch(spec, ctx.ranks)
        self.device = rank_device(resolve_device(spec.device), ctx.ranks)
        self.group = Group(ctx.ranks, self.device)
        self.group.start(spec.collective_timeout_s)
        data = DataOptions(self.prefetch_depth, self.data_builders)
        try:
            parts = build_parts(spec, ctx, self.device, self.group, components, data)
        except BaseException:
            self.group.close()
            raise
        self._restore_math = parts.restore_math
        self.precision, self.dataset, self.model = parts.precision, parts.dataset, parts.model
        self.channels_last, self.feeder, self.amp = parts.channels_last, parts.feeder, parts.amp
        self.optimizer, self.schedule, self.store = parts.optimizer, parts.schedule, parts.store
        self.publisher, self.telemetry, self.health = parts.publisher, parts.telemetry, parts.health
        self.evaluator = parts.evaluator
        self.layer_norms = LayerNorms(spec.telemetry.layer_grad_norms_every)
        self._peeked = parts.resume_peek
        self.step = 0
        self.micro_batch = spec.micro_batch_size
        self.grad_accum = spec.grad_accum_steps
        self.resumed_from: int | None = None
        self.rollbacks = 0  # health.spike rollbacks taken by the job (checkpointed)
        self._last_checkpoint_step: int | None = None
        self._healthy_step: int | None = None

    # -- public -----------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Train up to ``spec.max_steps``; raises a TrainingError subclass when it cannot."""
        try:
            self.telemetry.event("precision", self.step, **self.precision.to_dict())
            self.resume()
            while True:
                try:
                    self._train_to_the_end()
                    break
                except RollbackRequested as request:  # raised by any flush in it
                    roll_back(self, request.spike_step)
                    self._evaluate_if_due(final=False)  # if due at this step and not yet run
        except BaseException as exc:
            if isinstance(exc, PrecisionFallbackError):
                self._leave_fp16(exc)
            if not self.group.parallel:
                # Devices > 1: a flush is a collective the other ranks may never join.
                _flush_quietly(self.telemetry)
            raise
        finally:
            self.feeder.close()
            self.telemetry.close(self.drain_timeout_s)
            self.group.close()
            self._restore_math()
        return TrainResult(
            final_step=self.step,
            resumed_from=self.resumed_from,
            precision=self.precision,
            skipped_steps=self.telemetry.skipped_steps,
            overflow_counts=dict(self.telemetry.attribution.counts.most_common()),
            dropped_records=self.publisher.dropped,
            last_record=self.telemetry.last_record,
            rank=self.group.rank,
            world_size=self.group.world_size,
            eval=self.evaluator.last_values if self.evaluator else None,
        )

    def train_step(self) -> None:
        """One optimizer step over ``batch_size`` samples; retried smaller on OOM if allowed.

        An out-of-memory error in the forward, the backward or the optimizer step is
        handled the same way: the step is abandoned, the cached memory is released once
        the exception (whose traceback holds the step's activations) is gone, and the
        whole step runs again with half the micro-batch.
        """
        started = time.perf_counter()
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
            self._shrink_after_oom()
        self.schedule.advance(applied.withheld)
        self.step += 1
        values = {"loss": loss, "grad_norm": applied.grad_norm, "lr": lr}
        if applied.scale is not None and applied.found_inf is not None:  # fp16's scaler
            values.update(skipped=applied.found_inf, loss_scale=applied.scale)
        self.telemetry.record(
            self.step,
            values,
            samples=self.spec.batch_size,
            started=started,
            overflow=applied.overflow,
            spike=applied.spike,
            layers=self.layer_norms.due(self.step, applied.norms),
        )

    # -- internals ----------------------------------------------------------------------------

    def _train_to_the_end(self) -> None:
        while self.step < self.spec.max_steps:
            self._poll_stop()
            self.train_step()
            self._evaluate_if_due(final=False)
            if self.step % self.spec.checkpoint.every_steps == 0:
                self.save_checkpoint()
        # The last steps' spikes are read (and any rollback done) before the final evaluation.
        self.telemetry.flush()
        self._evaluate_if_due(final=True)
        if self._last_checkpoint_step != self.step:
            self.save_checkpoint()
        self.telemetry.flush()

    def _accumulate(self) -> torch.Tensor:
        """All micro-batches of the step; returns the mean loss (device tensor)."""
        self.optimizer.zero_grad(set_to_none=True)
        micro, accum = self.micro_batch, self.grad_accum
        # Rank r's contiguous share of the global batch: resume needs no sampler state.
        start = self.samples_consumed + self.group.rank * micro * accum
        total: torch.Tensor | None = None
        for i in range(accum):
            inputs, targets = self.feeder.get(start + i * micro, micro)
            loss = self.amp.forward_backward(inputs, targets, accum, last=i == accum - 1)
            total = loss if total is None else total + loss
        assert total is not None
        return total / accum if accum > 1 else total

    def _shrink_after_oom(self) -> None:
        """Halve the micro-batch (doubling accumulation) or raise OutOfMemoryError."""
        self.amp.abandon()
        self.feeder.reset()
        peak = snapshot(self.device).peak
        release_cached(self.device)
        old = self.micro_batch
        self.micro_batch = smaller_micro_batch(self.spec, self.step + 1, old, self.grad_accum, peak)
        self.grad_accum = self.spec.batch_size // self.micro_batch
        self.telemetry.event(
            "micro_batch",
            self.step,
            old=old,
            new=self.micro_batch,
            grad_accum_steps=self.grad_accum,
            reason=f"out of memory at micro-batch {old} (peak {format_bytes(peak)})",
        )

    def _evaluate_if_due(self, *, final: bool) -> None:
        if self.evaluator is None or not self.evaluator.due(self.step, final=final):
            return
        values = self.evaluator.run(self.step)
        # Through the flush: the sink gets it after the metrics of every step up to this one.
        self.telemetry.flush([records.evaluation(self.step, time.time(), values)])

    def _leave_fp16(self, error: PrecisionFallbackError) -> None:
        """The attempt ends for a precision fallback: keep the newest healthy checkpoint as
        the newest (the next attempt resumes from it) and say so in an event."""
        data = leave_fp16(self.store if self.group.leader else None, error)
        self.group.barrier()  # no rank's next attempt starts before the checkpoints are gone
        self.telemetry.event(PRECISION_FALLBACK, error.step or self.step, **data)

    def _poll_stop(self) -> None:
        reason = self.ctx.should_stop()
        if self.group.parallel:
            # Acted on only once every rank knows: the next flush carries it (MAX, cancel wins).
            if reason is not None and self.telemetry.stop_requested != "cancel":
                self.telemetry.stop_requested = reason
            reason = self.telemetry.agreed_stop
        if reason is None:
            return
        self.save_checkpoint()
        self.telemetry.flush()
        if reason == "preempt":
            raise PreemptedError(
                f"preempted at step {self.step}; checkpointed, resumable", step=self.step
            )
        raise CancelledError(f"cancelled at step {self.step}", step=self.step)


def _flush_quietly(telemetry: StepTelemetry) -> None:
    # Deliver the records of the steps that did finish before the failure.
    with contextlib.suppress(Exception):
        telemetry.flush()
