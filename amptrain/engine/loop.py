"""The Trainer: train -> train_step -> forward_backward, plus checkpoints, stop requests and OOM.

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
import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from amptrain.contract.errors import CancelledError, PreemptedError, ResumeMismatchError
from amptrain.contract.spec import JobSpec
from amptrain.engine.amp_step import AmpStep
from amptrain.engine.checkpoint import CheckpointStore, capture_rng, restore_rng
from amptrain.engine.context import Components, RunContext, TrainResult
from amptrain.engine.data import Feeder
from amptrain.engine.distributed import Group, check_launch, rank_device
from amptrain.engine.fit_check import check_fits
from amptrain.engine.health import HealthMonitor
from amptrain.engine.lr_schedule import DeviceSchedule
from amptrain.engine.memory import format_bytes, release_cached, snapshot
from amptrain.engine.oom import is_out_of_memory, smaller_micro_batch
from amptrain.engine.precision import apply_math_mode, choose_precision, resolve_device
from amptrain.engine.publisher import Publisher
from amptrain.engine.telemetry import StepTelemetry

CHECKPOINT_FORMAT = 2
"""What :meth:`Trainer.state_dict` writes and the only format :meth:`Trainer.load_state_dict`
reads (another is refused as ``resume_mismatch``). The schedule is ``{"applied_steps": n}``;
``world_size`` is the number of devices that wrote it; with more than one, ``rng_per_rank``
holds every rank's RNG states in rank order."""


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all CUDA devices too) from the job's seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Runs one job spec to completion, or to a TrainingError.

    Build it, then call :meth:`train` once. ``step`` is the number of optimizer
    steps done so far (it may be read from ``ctx.should_stop`` callbacks).
    """

    drain_timeout_s: float = 10.0
    """How long :meth:`train` lets the publisher deliver queued telemetry at the end."""
    prefetch_depth: int | None = None
    """Micro-batches background threads prepare ahead; 0 builds each one when needed.
    None: 2 on CUDA; 0 on a CPU, where the threads would compete with training for the same
    cores (measured: ~2% slower on 3.5 ms steps of a cheap dataset, bench/telemetry_overhead)."""
    data_builders: int | None = None
    """Threads that build one micro-batch together (datasets with ``fill``); None: the cores
    but one, at most 4 (:func:`~amptrain.engine.data.default_builders`)."""

    def __init__(
        self, spec: JobSpec, ctx: RunContext, components: Components | None = None
    ) -> None:
        self.spec = spec
        self.ctx = ctx
        check_launch(spec, ctx.ranks)
        self.device = rank_device(resolve_device(spec.device), ctx.ranks)
        self.group = Group(ctx.ranks, self.device)
        self.group.start(spec.collective_timeout_s)
        self._restore_math: Callable[[], None] = lambda: None
        try:
            self._build(components)
        except BaseException:
            self._restore_math()
            self.group.close()
            raise

    def _build(self, components: Components | None) -> None:
        spec, ctx = self.spec, self.ctx
        # Fails before any work; on a CPU, decides by the worker's bf16 measurement.
        precision = choose_precision(spec.precision, self.device, ctx.cpu_bf16_probe)
        # Process-wide switches: put back as they were when train() ends.
        self._restore_math = apply_math_mode(precision, self.device)
        self.precision = dataclasses.replace(
            precision, device=self.group.describe(precision.device)
        )
        seed_everything(spec.seed)  # the same on every rank: the same dataset and model
        parts = components or _build_components(spec, ctx, self.device, self.precision.effective)
        self.dataset = parts.dataset
        self.model, self.channels_last = _place_model(parts.model, self.device)
        wrapped = self.group.wrap(self.model)
        if self.group.rank > 0:
            # Dropout and other random ops draw differently on each rank (rank 0 keeps the
            # single-process stream).
            seed_everything((spec.seed + 1_000_003 * self.group.rank) % 2**32)
        self.optimizer = _registry().build_optimizer(
            spec.optimizer, self.model.parameters(), self.device
        )
        self.schedule = DeviceSchedule(
            _registry().lr_table(spec.schedule, spec.optimizer.lr, spec.max_steps), self.optimizer
        )
        depth = self.prefetch_depth
        if depth is None:
            depth = 2 if self.device.type == "cuda" else 0
        end = spec.max_steps * spec.batch_size
        self.feeder = Feeder(
            self.dataset,
            self.device,
            channels_last=self.channels_last,
            depth=depth,
            end=end,
            builders=self.data_builders,
            share=(self.group.rank, self.group.world_size, spec.batch_size),
        )
        self.amp = AmpStep(
            spec, wrapped, self.optimizer, parts.loss_fn, self.precision, self.device
        )
        self.step = 0
        self.micro_batch = spec.micro_batch_size
        self.grad_accum = spec.grad_accum_steps
        keep = spec.checkpoint.keep_last
        self.store = (
            CheckpointStore(ctx.checkpoint_dir, keep, writer=self.group.leader)
            if ctx.checkpoint_dir
            else None
        )
        self.resumed_from: int | None = None
        self._last_checkpoint_step: int | None = None
        # One series per job: the other ranks build the same records and publish none.
        sink = ctx.sink if self.group.leader else None
        self.publisher = Publisher(sink, spec.telemetry.queue_size)
        self.telemetry = StepTelemetry(
            spec.telemetry,
            self.device,
            HealthMonitor(spec.health, self.precision.effective),
            self.publisher,
            with_scaler=self.amp.scaler is not None,
            group=self.group,
        )

    # -- public -----------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Train up to ``spec.max_steps``; raises a TrainingError subclass when it cannot."""
        try:
            self._start()
            while self.step < self.spec.max_steps:
                self._poll_stop()
                self.train_step()
                if self.step % self.spec.checkpoint.every_steps == 0:
                    self.save_checkpoint()
            if self._last_checkpoint_step != self.step:
                self.save_checkpoint()
            self.telemetry.flush()
        except BaseException:
            if not self.group.parallel:
                # Devices > 1: a flush is a collective the other ranks may never join.
                self._flush_quietly()
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
            dropped_records=self.publisher.dropped,
            last_record=self.telemetry.last_record,
            rank=self.group.rank,
            world_size=self.group.world_size,
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
                applied = self.amp.apply()
                break
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                if not is_out_of_memory(exc):
                    raise
            # Outside the except block: the exception and its frames are released by now.
            self._shrink_after_oom()
        self.schedule.advance(applied.found_inf)
        self.step += 1
        values = {"loss": loss, "grad_norm": applied.grad_norm, "lr": lr}
        if applied.scale is not None and applied.found_inf is not None:  # fp16's scaler
            values.update(skipped=applied.found_inf, loss_scale=applied.scale)
        self.telemetry.record(self.step, values, samples=self.spec.batch_size, started=started)

    def state_dict(self) -> dict[str, Any]:
        """Everything exact resume needs, as tensors and plain types (weights_only-loadable).

        Devices > 1: a collective (it gathers every rank's RNG states); call it on all ranks."""
        scaler = self.amp.scaler
        rngs = self.group.gather_objects(capture_rng(self._rank_cuda))
        parallel = {"rng_per_rank": rngs} if self.group.parallel else {}
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "samples_consumed": self.samples_consumed,
            "micro_batch": self.micro_batch,
            "grad_accum_steps": self.grad_accum,
            "precision": self.precision.effective,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rngs[0],
            "world_size": self.group.world_size,
            **parallel,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the run then continues exactly where it was."""
        _check_format(state)
        saved = int(state["world_size"])
        if saved != self.group.world_size:
            raise ResumeMismatchError(
                f"cannot resume: the newest checkpoint (step {state['step']}) was written by "
                f"{saved} device(s) and this run has {self.group.world_size}; exact resume needs "
                f"the same number (RNG states and data shares are per device). Run with "
                f"devices: {saved}, or start afresh (another checkpoint directory, or "
                "--no-resume)",
                step=int(state["step"]),
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        _keep_build_options(self.optimizer)
        self.schedule.load_state_dict(state["scheduler"])
        if self.amp.scaler is not None and state.get("scaler"):
            self.amp.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self.micro_batch = int(state["micro_batch"])
        self.grad_accum = int(state["grad_accum_steps"])
        rng = state["rng_per_rank"][self.group.rank] if self.group.parallel else state["rng"]
        restore_rng(rng, self._rank_cuda)

    def save_checkpoint(self) -> str | None:
        """Write a checkpoint of the current step (if this run has a checkpoint dir)."""
        if self.store is None:
            return None
        # Telemetry first: a run resumed from this checkpoint never re-runs the steps
        # before it, so their records must be with the sink before the checkpoint exists.
        # Bounded: a stuck sink delays the checkpoint by at most drain_timeout_s.
        self.telemetry.flush()
        self.publisher.wait_delivered(self.drain_timeout_s)
        state = self.state_dict()
        path = self.store.save(self.step, state) if self.group.leader else None
        self.group.barrier()  # no rank goes on (or stops) before the checkpoint exists
        self._last_checkpoint_step = self.step
        self.telemetry.event("checkpoint", self.step, path=path)
        return path

    @property
    def samples_consumed(self) -> int:
        """Data position: every optimizer step consumes exactly ``batch_size`` samples."""
        return self.step * self.spec.batch_size

    # -- internals ----------------------------------------------------------------------------

    def _start(self) -> None:
        self.telemetry.event("precision", self.step, **self.precision.to_dict())
        if not (self.ctx.resume and self.store is not None):
            return
        latest = self.group.leader_value(self.store.latest())
        if latest is None:
            return
        self.load_state_dict(self.store.load(latest))
        self.resumed_from = self._last_checkpoint_step = self.step
        self.telemetry.event("resumed", self.step, from_step=self.step, path=latest)

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

    def _flush_quietly(self) -> None:
        # Deliver the records of the steps that did finish before the failure.
        with contextlib.suppress(Exception):
            self.telemetry.flush()

    @property
    def _rank_cuda(self) -> torch.device | None:
        """The one GPU whose RNG a data-parallel rank checkpoints (None: every initialised one)."""
        return self.device if self.group.parallel and self.device.type == "cuda" else None

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


def _place_model(model: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, bool]:
    """The model on its device (parameters stay fp32: autocast casts per op), and whether
    it went channels_last: NHWC is what tensor-core convolutions want on CUDA."""
    model = model.to(device)
    channels_last = device.type == "cuda" and any(
        isinstance(m, torch.nn.Conv2d) for m in model.modules()
    )
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model, channels_last


def _check_format(state: dict[str, Any]) -> None:
    """Refuse a checkpoint this engine did not write, before reading any of it."""
    found = state.get("format")
    if found != CHECKPOINT_FORMAT:
        step = state.get("step") if isinstance(state.get("step"), int) else None
        at = f" (step {step})" if step is not None else ""
        raise ResumeMismatchError(
            f"cannot resume: the newest checkpoint{at} is of format {found!r} and this engine "
            f"reads format {CHECKPOINT_FORMAT} only. Start afresh (another checkpoint "
            "directory, or --no-resume)",
            step=step,
        )


def _keep_build_options(optimizer: torch.optim.Optimizer) -> None:
    """``load_state_dict`` copies every saved group option over the built ones; keep the
    kernel choice (fused) this engine built, whatever an older checkpoint recorded."""
    for group in optimizer.param_groups:
        for key in ("fused", "foreach"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]


def _registry() -> Any:
    # Imported lazily: the registry pulls in every built-in component.
    from amptrain.components import registry

    return registry


def _build_components(
    spec: JobSpec, ctx: RunContext, device: torch.device, precision: str
) -> Components:
    reg = _registry()
    dataset = reg.build_dataset(spec.dataset, seed=spec.seed, data_roots=ctx.data_roots)
    check_fits(spec, dataset.info, device, precision)  # before the model allocates anything
    model = reg.build_model(spec.model, dataset.info)
    return Components(model=model, dataset=dataset, loss_fn=reg.loss_for(dataset.info))
