"""What a :class:`~amptrain.engine.loop.Trainer` is made of, built once from its spec: the
precision (and the process-wide math switches it sets), the components on their device,
the optimizer and its device-side schedule, the data feeder, the AMP step, the train state,
the checkpoints, the guardian and the telemetry path.

The order matters: the precision is chosen before anything is built (a spec that cannot
run fails first), the seed is set before the dataset and the model (every rank builds the
same ones), and the fit check runs before the model allocates anything.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from amptrain.contract.errors import InvalidSpecError, TooLargeError
from amptrain.contract.spec import JobSpec
from amptrain.engine import auto_precision
from amptrain.engine.amp_step import AmpStep
from amptrain.engine.checkpoint import CheckpointStore
from amptrain.engine.checkpoint_manager import CheckpointManager, RunState, learned_parts
from amptrain.engine.context import Components, RunContext, TrainResult
from amptrain.engine.data import Feeder
from amptrain.engine.data_events import DataEvents
from amptrain.engine.distributed import Group, check_launch, rank_device
from amptrain.engine.evaluation import Evaluator, build_evaluator
from amptrain.engine.fallback import fallback_target
from amptrain.engine.fit_check import check_fits
from amptrain.engine.forks import read_parent_checkpoint
from amptrain.engine.guardian import Guardian
from amptrain.engine.initial_weights import export_bytes
from amptrain.engine.layer_norms import LayerNorms
from amptrain.engine.loader import feeder_for
from amptrain.engine.lr_schedule import DeviceSchedule
from amptrain.engine.precision import (
    AUTOCAST_DTYPES,
    PrecisionChoice,
    apply_math_mode,
    choose_precision,
    resolve_device,
)
from amptrain.engine.publisher import Publisher
from amptrain.engine.sharding import Sharding
from amptrain.engine.spikes import spike_check
from amptrain.engine.telemetry import StepTelemetry
from amptrain.engine.train_state import TrainState


@dataclass
class Parts:
    device: torch.device
    group: Group
    """This process's place in a data-parallel run (started; the Trainer closes it)."""
    precision: PrecisionChoice
    restore_math: Callable[[], None]
    """Puts back the process-wide math switches (TF32, cuDNN benchmark, deterministic mode)."""
    dataset: Any
    model: torch.nn.Module
    channels_last: bool
    optimizer: torch.optim.Optimizer
    schedule: DeviceSchedule
    feeder: Feeder
    amp: AmpStep
    state: TrainState
    run_state: RunState
    checkpoints: CheckpointManager
    publisher: Publisher
    guardian: Guardian
    telemetry: StepTelemetry
    evaluator: Evaluator | None
    layer_norms: LayerNorms

    def result(self) -> TrainResult:
        """What the run reports once it finished normally."""
        telemetry = self.telemetry
        return TrainResult(
            final_step=self.state.step,
            resumed_from=self.state.resumed_from,
            precision=self.precision,
            skipped_steps=telemetry.skipped_steps,
            overflow_counts=dict(telemetry.attribution.counts.most_common()),
            dropped_records=self.publisher.dropped,
            last_record=telemetry.last_record,
            rank=self.group.rank,
            world_size=self.group.world_size,
            eval=self.evaluator.last_values if self.evaluator else None,
        )


@dataclass(frozen=True)
class DataOptions:
    prefetch_depth: int | None = None
    """Micro-batches background threads prepare ahead; 0 builds each one when needed.
    None: 2 on CUDA; 0 on a CPU, where the threads would compete with training for the same
    cores (measured: ~2% slower on 3.5 ms steps of a cheap dataset, bench/telemetry_overhead)."""
    builders: int | None = None
    """Threads that build one micro-batch together (datasets with ``fill``); None: the cores
    but one, at most 4 (:func:`~amptrain.engine.data.default_builders`)."""
    read_later: bool | None = None
    """How telemetry reads device values (see :class:`~amptrain.engine.telemetry.
    StepTelemetry`): None as the device does (one flush late on a single GPU); True on a CPU
    emulates that order, which tests use to run every guardian decision in both."""


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all CUDA devices too) from the job's seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build(
    spec: JobSpec, ctx: RunContext, components: Components | None, data: DataOptions
) -> Parts:
    """Everything a run needs, on this rank's device, its group started (closed again, and
    the math switches put back, when building fails)."""
    check_launch(spec, ctx.ranks)
    device = rank_device(resolve_device(spec.device), ctx.ranks)
    group = Group(ctx.ranks, device)
    group.start(spec.collective_timeout_s)
    try:
        return build_parts(spec, ctx, device, group, components, data)
    except BaseException:
        group.close()
        raise


def build_parts(
    spec: JobSpec,
    ctx: RunContext,
    device: torch.device,
    group: Group,
    components: Components | None,
    data: DataOptions,
) -> Parts:
    """Everything a run needs; on failure the math switches are put back first."""
    # Fails before any work. For ``auto`` this is the capability rule: what the fit check
    # assumes, and the fallback when the job's model cannot be measured (below).
    chosen = _choose(spec, ctx, device)
    # Process-wide switches: put back as they were when train() ends (or this fails).
    restore_math = apply_math_mode(chosen, device, spec.deterministic)
    try:
        described = group.describe(chosen.device, spec.parallelism)
        precision = dataclasses.replace(chosen, device=described)
        seed_everything(spec.seed)  # the same on every rank: the same dataset and model
        made = components or _build_components(spec, ctx, device, precision.effective)
        model, channels_last = _place_model(made.model, device)
        kept = spec.checkpoint
        export = functools.partial(export_bytes, model)  # beside each checkpoint
        checkpoints = CheckpointManager(
            _store(spec, ctx, group), kept.keep_last, kept.every_steps, group, export
        )
        if spec.precision == "auto" and ctx.precision_override is None:
            decided = _decide_auto(
                spec, ctx, device, group, checkpoints, precision, made, model, channels_last
            )
            if decided.effective != precision.effective:
                restore_math()
                restore_math = apply_math_mode(decided, device, spec.deterministic)
            precision = decided
        sharding = Sharding(spec, group, precision.effective)
        wrapped = sharding.wrap(model)  # fsdp: ``model`` itself, its parameters now shards
        if group.rank > 0:
            # Dropout and other random ops draw differently on each rank (rank 0 keeps the
            # single-process stream).
            seed_everything((spec.seed + 1_000_003 * group.rank) % 2**32)
        optimizer = _registry().build_optimizer(spec.optimizer, model.parameters(), device)
        if sharding.sharded:
            sharding.attach(optimizer)
            checkpoints.shards = sharding
        rule = spec.health.spike
        spike = spike_check(rule, device) if rule is not None else None
        amp = AmpStep(spec, wrapped, optimizer, made.loss_fn, precision, device, spike)
        evaluator = build_evaluator(spec, made.dataset, model, amp, device, group, channels_last)
        publisher = Publisher(ctx.sink if group.leader else None, spec.telemetry.queue_size)
        fallback = fallback_target(spec, precision, device)
        guardian = Guardian(spec.health, precision.effective, fallback)
        schedule = _schedule(spec, optimizer)
        state = TrainState(
            batch_size=spec.batch_size,
            micro_batch=spec.micro_batch_size,
            grad_accum=spec.grad_accum_steps,
            precision=precision.effective,
            precision_reason=precision.reason,
        )
        learned = learned_parts(model, optimizer, schedule, amp.scaler, amp.spike)
        if sharding.sharded:  # through the checkpoints' Distributed Checkpoint instead
            learned.update(model=None, optimizer=None)
        feeder = _feeder(spec, device, group, made.dataset, channels_last, data)
        telemetry = StepTelemetry(
            spec.telemetry,
            device,
            publisher,  # one series per job: the other ranks' publishers have no sink
            with_scaler=amp.scaler is not None,
            group=group,
            read_later=data.read_later,
            spike=rule,
        )
        telemetry.extras = DataEvents(feeder).take
        return Parts(
            device=device,
            group=group,
            precision=precision,
            restore_math=restore_math,
            dataset=made.dataset,
            model=model,
            channels_last=channels_last,
            optimizer=optimizer,
            schedule=schedule,
            feeder=feeder,
            amp=amp,
            state=state,
            run_state=RunState(state, learned, group, device, ctx.attempt, spec.parallelism),
            checkpoints=checkpoints,
            publisher=publisher,
            guardian=guardian,
            telemetry=telemetry,
            evaluator=evaluator,
            layer_norms=LayerNorms(spec.telemetry.layer_grad_norms_every),
        )
    except BaseException:
        restore_math()
        raise


def _choose(spec: JobSpec, ctx: RunContext, device: torch.device) -> PrecisionChoice:
    """The spec's precision by its policy, or after a fallback the one fp16 fell back to."""
    override = ctx.precision_override
    if override is None:
        return choose_precision(spec.precision, device, ctx.cpu_bf16_probe)
    chosen = choose_precision(override, device, ctx.cpu_bf16_probe)
    reason = f"health.fallback: fp16 became unhealthy in an earlier attempt ({chosen.reason})"
    return dataclasses.replace(chosen, requested=spec.precision, reason=reason)


def _decide_auto(
    spec: JobSpec,
    ctx: RunContext,
    device: torch.device,
    group: Group,
    checkpoints: CheckpointManager,
    rule: PrecisionChoice,
    made: Components,
    model: torch.nn.Module,
    channels_last: bool,
) -> PrecisionChoice:
    """``auto``'s precision for this attempt, decided by the leader for every rank: the one
    its resume checkpoint recorded (a new measurement could come out the other way, and
    exact resume needs the same precision), else the job's model measured
    (:mod:`~amptrain.engine.auto_precision`). The checkpoint read stays with the manager,
    which hands it to the resume without reading it again."""
    decided: dict[str, Any] | None = None
    if group.leader:
        resume_from = None
        if ctx.resume and checkpoints.enabled:
            resume_from = checkpoints.find(recorded=ctx.recorded)
        peek = checkpoints.load(resume_from) if resume_from is not None else None
        if peek is None and ctx.fork is not None:  # a fork trains on as its parent did
            peek = read_parent_checkpoint(ctx.fork)
        recorded = _recorded_precision(peek, rule, device)
        if recorded is None:
            recorded = _measured(spec, ctx, device, rule, made, model, channels_last)
            recorded = _fitting(spec, device, rule, recorded, made)
        decided = recorded.to_dict()
    decided = group.leader_value(decided)
    assert decided is not None
    return dataclasses.replace(PrecisionChoice(**decided), device=rule.device)


def _measured(
    spec: JobSpec,
    ctx: RunContext,
    device: torch.device,
    rule: PrecisionChoice,
    made: Components,
    model: torch.nn.Module,
    channels_last: bool,
) -> PrecisionChoice:
    """The job's model measured on the dataset's first micro-batch (samples are pure
    functions of their index: reading it moves no data position); the rule if none comes."""
    try:
        micro = made.dataset.batch(0, spec.micro_batch_size)
    except Exception as exc:  # a dataset without ``batch`` (an injected one): the rule
        reason = f"{rule.reason} (the measurement could not run: {type(exc).__name__})"
        return dataclasses.replace(rule, reason=reason)
    if channels_last and micro[0].dim() == 4:  # as the feeder delivers it
        micro = (micro[0].to(memory_format=torch.channels_last), micro[1])
    return auto_precision.decide(
        rule,
        model,
        made.loss_fn,
        micro,
        device,
        model_ref=spec.model.model_dump(mode="json"),
        cache=ctx.precision_cache,
    )


def _fitting(
    spec: JobSpec,
    device: torch.device,
    rule: PrecisionChoice,
    measured: PrecisionChoice,
    made: Components,
) -> PrecisionChoice:
    """The measured choice, unless it is the baseline and, unlike the rule's low precision
    (which the fit check passed), would not fit the device: a measurement must not turn a
    job that fits into one that cannot (fp32 keeps twice bf16's activations)."""
    info = getattr(made.dataset, "info", None)
    if measured.effective == rule.effective or info is None:
        return measured
    try:
        check_fits(spec, info, device, measured.effective)
    except TooLargeError:
        reason = f"{measured.reason}; but {measured.effective} would not fit: {rule.effective}"
        return dataclasses.replace(measured, effective=rule.effective, reason=reason)
    return measured


def _recorded_precision(
    state: dict[str, Any] | None, rule: PrecisionChoice, device: torch.device
) -> PrecisionChoice | None:
    """The precision the checkpoint to resume from trained in, if it is one this device runs."""
    if state is None:
        return None
    effective = state.get("precision")
    if effective not in AUTOCAST_DTYPES:
        return None
    try:
        choose_precision(str(effective), device)  # bf16 written on a GPU that has it, ...
    except InvalidSpecError:
        return None  # ... resumed on one that has not: measure what this device runs
    before = state.get("precision_reason")
    reason = f"recorded by the checkpoint resumed from (step {state.get('step')})"
    reason += f": {before}" if before else ""
    return PrecisionChoice(rule.requested, effective, reason, rule.device)


def _schedule(spec: JobSpec, optimizer: torch.optim.Optimizer) -> DeviceSchedule:
    table = _registry().lr_table(spec.schedule, spec.optimizer.lr, spec.max_steps)
    return DeviceSchedule(table, optimizer)


def _feeder(
    spec: JobSpec,
    device: torch.device,
    group: Group,
    dataset: Any,
    channels_last: bool,
    data: DataOptions,
) -> Feeder:
    depth = data.prefetch_depth
    if depth is None:
        depth = 2 if device.type == "cuda" else 0
    share = (group.rank, group.world_size, spec.batch_size)
    return feeder_for(spec, dataset, device, share, channels_last, depth, data.builders)


def _store(spec: JobSpec, ctx: RunContext, group: Group) -> CheckpointStore | None:
    if not ctx.checkpoint_dir:
        return None
    return CheckpointStore(ctx.checkpoint_dir, spec.checkpoint.keep_last, writer=group.leader)


def _place_model(model: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, bool]:
    """The model on its device (parameters stay fp32: autocast casts per op), and whether
    it went channels_last: NHWC is what tensor-core convolutions want on CUDA."""
    model = model.to(device)
    channels_last = device.type == "cuda" and any(
        isinstance(m, torch.nn.Conv2d) for m in model.modules()
    )
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, channels_last


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
