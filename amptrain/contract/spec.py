"""The job spec: what a user asks amptrain to train.

Torch-free on purpose: the API validates submissions with this module and must never import
torch. Every field carries a docstring (pydantic turns them into the JSON schema's
descriptions) and every model rejects unknown fields, so a typo such as ``"max_step"`` is an
error that names the field, not a silent default. Every number has bounds (shown in the
OpenAPI schema and ``GET /catalog``): a spec is user input on a shared service, and a batch
of 1e30 or a checkpoint every step kept forever must be refused with a 422, not discovered by
a worker. Floats must be finite: JSON's NaN/Infinity would be stored as null and the worker
would train another spec than the one shown.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from amptrain.contract.alerts import MAX_RULES_PER_JOB_SPEC, JobAlert, is_step_series
from amptrain.contract.eval_choice import EVAL_CHOICES
from amptrain.contract.health_spec import MAX_SPIKE_WINDOW as MAX_SPIKE_WINDOW
from amptrain.contract.health_spec import MAX_STEPS as MAX_STEPS
from amptrain.contract.health_spec import Fallback as Fallback
from amptrain.contract.health_spec import HealthSpec, StrictModel
from amptrain.contract.health_spec import SpikeSpec as SpikeSpec
from amptrain.contract.metrics import SERIES_NAME_MAX
from amptrain.contract.text import check_text, plain_value

Precision = Literal["auto", "fp32", "tf32", "fp16", "bf16"]
DeviceKind = Literal["auto", "cpu", "cuda"]
Parallelism = Literal["ddp", "fsdp"]

MAX_BATCH = 65_536
MAX_RUNTIME_S = 30 * 24 * 3600
"""Largest ``max_runtime_s`` a spec may ask for; the service's own limit is usually lower."""
MAX_SEED = 2**32 - 1
MAX_DEVICES = 8
"""Most data-parallel processes (GPUs) one job may ask for: one machine's worth."""
MAX_NODES = 16
"""Most machines (workers) one job may train on at once (``nodes``); a service may allow
fewer (``AMPTRAIN_MAX_NODES``)."""
MIN_COLLECTIVE_TIMEOUT_S = 5
MAX_COLLECTIVE_TIMEOUT_S = 3600
MAX_ARGS = 64
MAX_WEIGHTS_PATH = 1024
MAX_LOADER_WORKERS = 64
MAX_ARG_TEXT = 4096

Text = Annotated[str, AfterValidator(check_text)]
"""A string without control or bidi-formatting characters."""
Beta = Annotated[float, Field(ge=0, lt=1)]
_ARG_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
ArgValue = Annotated[Any, AfterValidator(lambda v: plain_value(v, MAX_ARG_TEXT))]


_Strict = StrictModel


class ComponentRef(_Strict):
    """A registered component (model or dataset) and the arguments it is built with."""

    name: Text = Field(min_length=1, max_length=100)
    """Registered name, e.g. ``mlp`` or ``synthetic-classification``; see ``GET /catalog``."""
    args: dict[Annotated[str, Field(pattern=_ARG_NAME)], ArgValue] = Field(
        default_factory=dict, max_length=MAX_ARGS
    )
    """Keyword arguments for the component's constructor; unknown ones are rejected, and
    each built-in argument has the type and bounds ``GET /catalog`` lists."""


class OptimizerSpec(_Strict):
    name: Literal["adamw", "sgd"] = "adamw"
    """Optimizer: ``adamw`` (fused on CUDA, so fp16 needs no per-step host sync) or ``sgd``."""
    lr: float = Field(default=1e-3, gt=0, le=1e12)
    """Peak learning rate, reached after the warm-up."""
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    """Decoupled weight decay (AdamW) or L2 penalty (SGD)."""
    momentum: float = Field(default=0.9, ge=0, lt=1)
    """SGD momentum; ignored by AdamW."""
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """AdamW's moment decay rates, each in [0, 1); ignored by SGD."""
    eps: float = Field(default=1e-8, gt=0, le=1)
    """AdamW's denominator term (added to the root of the second moment); ignored by SGD."""


class ScheduleSpec(_Strict):
    name: Literal["cosine", "linear", "constant"] = "cosine"
    """Learning-rate schedule after the warm-up: cosine or linear decay to ``min_lr_ratio``, or constant."""
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS)
    """Steps of linear warm-up from 0 to ``optimizer.lr``."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final learning rate as a fraction of the peak."""


class LossScaleSpec(_Strict):
    """Dynamic loss scaling for fp16 (``torch.amp.GradScaler``); ignored for bf16 and fp32."""

    init_scale: float = Field(default=65536.0, gt=0, le=2.0**32)
    """Initial loss scale (PyTorch's default, 2**16)."""
    growth_factor: float = Field(default=2.0, gt=1, le=1000)
    """Factor the scale grows by after ``growth_interval`` clean steps."""
    backoff_factor: float = Field(default=0.5, gt=0, lt=1)
    """Factor the scale shrinks by on a step with inf/NaN gradients."""
    growth_interval: int = Field(default=2000, ge=1, le=MAX_STEPS)
    """Clean steps between two growths."""


class TelemetrySpec(_Strict):
    flush_every_steps: int = Field(default=10, ge=1, le=100_000)
    """Per-step values stay on the device and reach the host once every this many steps..."""
    flush_every_ms: int = Field(default=500, ge=1, le=3_600_000)
    """...or after this many milliseconds, whichever comes first (``devices`` 1 only: with
    several, flushes go by step count alone, which every process counts alike)."""
    queue_size: int = Field(default=10_000, ge=1, le=1_000_000)
    """Records buffered for the sink; beyond that, records are dropped and counted, never waited for."""
    layer_grad_norms_every: int | None = Field(default=None, ge=1, le=100_000)
    """Record each layer's gradient norm (the norm of its parameters' gradients after
    unscaling, before clipping; a layer is a module path, ``blocks.3.attn``) every this
    many optimizer steps, as named series (``GET /jobs/{id}/layer-norms``); null: off,
    costing nothing. The norms come from the step's fused per-parameter norms and reach
    the host with the flush's one read. At most
    :data:`~amptrain.contract.metrics.LAYER_NORMS_MAX` layers: a larger model is grouped
    by shorter module paths."""


class CheckpointSpec(_Strict):
    every_steps: int = Field(default=500, ge=1, le=MAX_STEPS)
    """Write a checkpoint every this many optimizer steps (and at the end)."""
    keep_last: int = Field(default=3, ge=1, le=100)
    """Checkpoints kept; older ones are deleted after a newer one is safely written."""


def _known_eval_metrics(names: list[str] | None) -> list[str] | None:
    if names is None:
        return None
    # Imported here: the catalog imports this module (and reads installed plugin metadata
    # only when a spec names metrics, not for every spec).
    from amptrain.contract.catalog import plugin_entry_points

    known = set(EVAL_CHOICES)
    if any(n not in known for n in names):
        known |= set(plugin_entry_points("metric"))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown evaluation metrics {unknown}; known: {sorted(known)}")
    return names


class EvalSpec(_Strict):
    """Evaluation on the dataset's held-out split (never trained on)."""

    enabled: bool | None = None
    """Evaluate at all; null: on when the dataset has a held-out split."""
    every_steps: int = Field(default=0, ge=0, le=MAX_STEPS)
    """Evaluate after every this many optimizer steps; 0: only at the end (``at_end``)."""
    batches: int = Field(default=20, ge=1, le=10_000)
    """Batches of ``batch_size`` samples per evaluation (fewer when the split is smaller)."""
    at_end: bool = True
    """Evaluate after the last step (once, even when ``every_steps`` divides it too)."""
    # The bound on the list, not on the union: the stored spec says `"metrics": null`,
    # which the worker parses again.
    metrics: (
        Annotated[
            list[Annotated[str, Field(max_length=SERIES_NAME_MAX)]],
            AfterValidator(_known_eval_metrics),
            Field(max_length=64),
        ]
        | None
    ) = None
    """Metrics to emit (see ``GET /catalog``'s ``eval_metrics``): built-in ones and those
    installed plugins register (entry-point group ``amptrain.metrics``); null: the task's
    built-ins (classification: eval_loss, accuracy, top5_accuracy with more than 5 classes;
    language model: eval_loss, perplexity, token_accuracy); on request, a classifier's f1_macro,
    precision_macro, recall_macro, auroc_macro, confusion_matrix (an event). Others: refused."""


class WeightsSpec(_Strict):
    """Weights to start from instead of the model's random initialisation (a fresh start
    only: a resumed attempt loads its checkpoint). Model-agnostic: the file's tensor names
    and shapes are those of the model's ``state_dict()`` (a Hugging Face model's own names)."""

    path: Text = Field(min_length=1, max_length=MAX_WEIGHTS_PATH)
    """A ``.safetensors`` file under the service's weights roots (``AMPTRAIN_WEIGHTS_ROOTS``;
    with per-user data roots, under ``ROOT/<token name>/``): relative to them, or absolute
    inside one; no ``..`` out of a root, no symlink, a regular file. Safetensors only: a
    pickle or ``torch.save`` file is refused. A job's checkpoint exported with ``POST
    /jobs/{id}/checkpoints/{step}/export`` is one."""
    strict: bool = Field(default=True, strict=True)
    """``true``: every tensor of the model is in the file with its shape, and nothing else is
    (the first difference fails the job as ``invalid_spec``). ``false``: load the tensors
    whose name and shape match and keep the model's own initialisation for the rest (a new
    head with another class count); the ``weights`` event lists what was left out."""


class JobSpec(_Strict):
    """A declarative training job. Only ``model``, ``dataset`` and ``max_steps`` are required.

    Rules across fields (each a 422 naming the problem): ``grad_accum_steps`` x ``devices``
    (x ``nodes``) divides ``batch_size``; ``auto_micro_batch`` needs ``devices`` and ``nodes``
    1; ``parallelism: fsdp`` needs more than one process (``devices`` x ``nodes``); ``queue`` is one of
    the service's queues; a model's arguments fit one another (a ``transformer``'s
    ``n_heads`` divides its ``d_model``) and what the dataset yields."""

    name: Text = Field(default="job", min_length=1, max_length=200)
    """Human-readable name shown in listings (no control or formatting characters)."""
    model: ComponentRef
    """The model to train, by registered name."""
    dataset: ComponentRef
    """The data to train on, by registered name."""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """Optimizer and its hyper-parameters."""
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    """Learning-rate schedule."""
    precision: Precision = "auto"
    """``auto`` measures this job's model for a few steps (about 2 s at most) in each candidate:
    bf16 against tf32 on CUDA capability >= 8.0, fp16 against fp32 on 7.x, bf16 against fp32
    on a CPU; the low precision wins when at least 1.1x faster with a finite loss, and the
    reason names the measured ratio. A resumed attempt keeps its checkpoint's precision. If
    the model cannot be measured, the capability rule: bf16 on >= 8.0, fp16 + loss scaling on
    7.x, fp32 elsewhere (bf16 on CPUs with AMX, or avx512_bf16 where a small CNN runs faster).
    ``fp32`` is strict IEEE; ``tf32`` is fp32 with TF32 tensor-core matmuls and convolutions."""
    batch_size: int = Field(default=64, ge=1, le=MAX_BATCH)
    """Global batch size per optimizer step: micro-batch x ``grad_accum_steps`` x ``devices``,
    so it must be divisible by ``grad_accum_steps`` x ``devices`` (a 422 otherwise)."""
    grad_accum_steps: int = Field(default=1, ge=1, le=MAX_BATCH)
    """Micro-batches each device accumulates per optimizer step; this x ``devices`` must
    divide ``batch_size`` (a 422 otherwise)."""
    devices: int = Field(default=1, ge=1, le=MAX_DEVICES)
    """Data-parallel processes, one per GPU of one machine (DDP: NCCL on CUDA, gloo on a CPU).
    Each takes its contiguous share of every global batch; the result matches one device
    accumulating the same micro-batches. Resuming needs the same number of devices."""
    nodes: int = Field(default=1, ge=1, le=MAX_NODES, strict=True)
    """Machines (workers of the job's queue) training this one job together, each running
    ``devices`` processes: the world is ``nodes`` x ``devices`` processes, which share every
    global batch as ``devices`` alone does. The nodes are reserved all at once (the job waits,
    holding no worker, while too few have a free slot) and rendezvous through PyTorch's c10d
    on the first one; a node that fails ends the attempt on all of them. The service sets
    the rendezvous address and ports, never the spec. Resuming needs the same
    ``nodes`` x ``devices``."""
    parallelism: Parallelism = "ddp"
    """How ``devices`` > 1 hold the model. ``ddp``: every device keeps a full copy of the
    weights, gradients and optimizer state. ``fsdp``: PyTorch FSDP2 shards them across the
    devices (per block, then the whole model), so each holds about 1/``devices`` of that
    state plus one block gathered at a time; weights are gathered in the job's precision
    (bf16/fp16) with fp32 master weights and fp32 gradient reduction, and checkpoints are
    sharded (PyTorch Distributed Checkpoint). Needs more than one process (``devices`` x
    ``nodes``; one has nothing to shard with: a 422). Resuming needs the same number of
    processes and the same ``parallelism``."""
    activation_checkpointing: bool = Field(default=False, strict=True)
    """Keep only each block's input in the forward pass and recompute the rest in the
    backward (non-reentrant ``torch.utils.checkpoint``): less activation memory for about one
    more forward pass of compute; the losses are the same. Works with ``ddp`` and ``fsdp``
    and on one device; a model without repeated blocks (transformer blocks, ResNet blocks,
    the MLP's hidden layers) is unchanged. ``true`` or ``false`` only."""
    collective_timeout_s: int = Field(
        default=600, ge=MIN_COLLECTIVE_TIMEOUT_S, le=MAX_COLLECTIVE_TIMEOUT_S
    )
    """With ``devices`` > 1: seconds a collective (gradient all-reduce, telemetry reduction,
    checkpoint barrier) may wait for the other processes before the attempt fails, so a
    hung or lost process ends the attempt instead of stalling it (5 to 3600)."""
    max_steps: int = Field(ge=1, le=MAX_STEPS)
    """Optimizer steps to train for."""
    max_runtime_s: int | None = Field(default=None, ge=1, le=MAX_RUNTIME_S)
    """Wall-clock limit of one attempt, in seconds: past it the job checkpoints, stops and
    fails with ``timeout``. Null takes the service's default; the service refuses more than
    its configured maximum."""
    grad_clip_norm: float | None = Field(default=1.0, gt=0, le=1e6)
    """Clip the global gradient norm to this (after unscaling); null disables clipping."""
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    """Seeds every random number generator; the same spec and seed give the same run."""
    # strict: pydantic's lax bool takes "yes", "off", 1 and 0; a spec that says anything but
    # true or false about a promise of bitwise results is a mistake worth a 422.
    deterministic: bool = Field(default=False, strict=True)
    """Bitwise-reproducible training: PyTorch's deterministic algorithms (an op without one
    fails the job as ``invalid_spec`` naming the op), and on CUDA cuDNN's deterministic
    algorithms without autotuning and a fixed cuBLAS workspace. A resumed run then matches an
    uninterrupted one bit for bit on the same GPU model, driver and torch version; without it,
    CUDA runs match in data order, RNG and optimizer state but not bit for bit. A CPU run in
    fp32 is bitwise either way; CPU bf16 convolutions are not, even with this on: oneDNN's
    bf16 convolution backward can differ in the last bits from one call to the next
    (measured with ResNet-18 on 16-px images, even on one thread; turning oneDNN off makes it
    repeat but costs about 10x). Costs speed on CUDA (see the README). ``true`` or ``false``
    only."""
    device: DeviceKind = "auto"
    """``auto`` uses CUDA when the worker has it, else the CPU."""
    queue: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._-]{0,15}$")
    """Worker queue to run on, e.g. ``gpu-a100`` for workers started with ``-Q gpu-a100``;
    default ``gpu``, or ``cpu`` when ``device`` is ``cpu``."""
    auto_micro_batch: bool = False
    """On CUDA out-of-memory, halve the micro-batch and double accumulation instead of failing
    (``devices`` 1 only: one process shrinking alone would fall out of step with the others)."""
    max_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts before the job fails for good (only retryable failures are retried)."""
    loss_scale: LossScaleSpec = Field(default_factory=LossScaleSpec)
    """Dynamic loss scaling (fp16 only)."""
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec)
    """How per-step records are batched."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """How often to checkpoint and how many to keep."""
    health: HealthSpec = Field(default_factory=HealthSpec)
    """Thresholds for warnings and divergence."""
    eval: EvalSpec = Field(default_factory=EvalSpec)
    """Evaluation on the held-out split: when, how much, which metrics."""
    loader_workers: int | None = Field(default=None, ge=0, le=MAX_LOADER_WORKERS)
    """Processes building micro-batches ahead, per device (DataLoader workers); 0: threads.
    Null: threads, or for datasets that decode files the free cores per device (at most 8)."""
    weights: WeightsSpec | None = None
    """Start from an operator-provided safetensors file (fine-tuning); null: the model's
    own initialisation."""
    alerts: list[JobAlert] = Field(default_factory=list, max_length=MAX_RULES_PER_JOB_SPEC)
    """Alert rules of this job alone (see ``POST /alerts/rules``; their scope is this job):
    e.g. an ``early_stop`` on ``eval_loss``, or a webhook on ``diverged``. Each becomes a
    rule of the submitter, listed by ``GET /alerts/rules`` (its secret via
    ``POST /alerts/rules/{id}/secret``)."""

    @model_validator(mode="after")
    def _accumulation_divides_batch(self) -> JobSpec:
        if self.world_size == 1 and self.batch_size % self.grad_accum_steps:
            raise ValueError(
                f"grad_accum_steps ({self.grad_accum_steps}) must divide batch_size ({self.batch_size})"
            )
        share = self.world_size * self.grad_accum_steps
        if self.batch_size % share:
            nodes = "nodes x " if self.nodes > 1 else ""
            count = f"{self.nodes} x " if self.nodes > 1 else ""
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by {nodes}devices x "
                f"grad_accum_steps ({count}{self.devices} x {self.grad_accum_steps} = {share}): "
                "every device takes an equal share of micro-batches"
            )
        every, spike = self.checkpoint.every_steps, self.health.spike
        if spike is not None and spike.action == "rollback" and every >= self.max_steps:
            raise ValueError(
                f"health.spike.action rollback needs checkpoint.every_steps ({every}) below "
                f"max_steps ({self.max_steps}): else no checkpoint precedes a spike"
            )
        if self.world_size > 1 and self.health.spike is not None:
            raise ValueError(
                f"health.spike needs {self._one_process()}: each process "
                "sees its own share's loss, and agreeing on a spike before the optimizer "
                "step would cost a collective every step"
            )
        if self.health.fallback not in (None, "none") and self.precision not in ("fp16", "auto"):
            raise ValueError(
                f"health.fallback {self.health.fallback!r} needs precision fp16 or auto (got "
                f"{self.precision!r}): a fallback only ever leaves fp16"
            )
        if self.parallelism == "fsdp" and self.world_size == 1:
            raise ValueError(
                "parallelism fsdp needs devices > 1 (got devices 1) or nodes > 1: sharding the "
                "model across one process saves nothing; use ddp (the default) or more devices"
            )
        for i, alert in enumerate(self.alerts):
            series = getattr(alert.when, "series", None)
            named = self.eval.metrics
            eval_series = series is not None and not is_step_series(series)
            if eval_series and named is not None and series not in named:
                raise ValueError(
                    f"alerts.{i}.when.series {series!r} is not among eval.metrics "
                    f"({', '.join(named)}): the rule would never see a value"
                )
        if self.world_size > 1 and self.auto_micro_batch:
            raise ValueError(
                f"auto_micro_batch needs {self._one_process()}: one process "
                "halving its micro-batch after running out of memory would fall out of step "
                "with the others; raise grad_accum_steps instead"
            )
        return self

    def _one_process(self) -> str:
        if self.nodes == 1:
            return f"devices 1 (got devices {self.devices})"
        return f"devices 1 and nodes 1 (got devices {self.devices}, nodes {self.nodes})"

    @property
    def world_size(self) -> int:
        """Data-parallel processes in all: ``nodes`` x ``devices``."""
        return self.nodes * self.devices

    @property
    def micro_batch_size(self) -> int:
        """Samples one device puts through one forward pass."""
        return self.batch_size // (self.grad_accum_steps * self.world_size)


def parse_spec(data: dict[str, Any]) -> JobSpec:
    """Validate a JSON-like dict; raises ``pydantic.ValidationError`` naming each bad field."""
    return JobSpec.model_validate(data)
