"""The job spec: what a user asks amptrain to train.

Torch-free on purpose: the API validates submissions with this module and must
never import torch. Every field carries a docstring (pydantic turns them into
the JSON schema's descriptions) and every model rejects unknown fields, so a
typo such as ``"max_step"`` is an error that names the field, not a silent
default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

Precision = Literal["auto", "fp32", "tf32", "fp16", "bf16"]
DeviceKind = Literal["auto", "cpu", "cuda"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class ComponentRef(_Strict):
    """A registered component (model or dataset) and the arguments it is built with."""

    name: str = Field(min_length=1)
    """Registered name, e.g. ``mlp`` or ``synthetic-classification``; see ``GET /catalog``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the component's constructor; unknown ones are rejected."""


class OptimizerSpec(_Strict):
    name: Literal["adamw", "sgd"] = "adamw"
    """Optimizer: ``adamw`` (fused on CUDA, so fp16 needs no per-step host sync) or ``sgd``."""
    lr: float = Field(default=1e-3, gt=0)
    """Peak learning rate, reached after the warm-up."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay (AdamW) or L2 penalty (SGD)."""
    momentum: float = Field(default=0.9, ge=0, lt=1)
    """SGD momentum; ignored by AdamW."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's moment decay rates; ignored by SGD."""


class ScheduleSpec(_Strict):
    name: Literal["cosine", "linear", "constant"] = "cosine"
    """Learning-rate schedule after the warm-up: cosine or linear decay to ``min_lr_ratio``, or constant."""
    warmup_steps: int = Field(default=0, ge=0)
    """Steps of linear warm-up from 0 to ``optimizer.lr``."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final learning rate as a fraction of the peak."""


class LossScaleSpec(_Strict):
    """Dynamic loss scaling for fp16 (``torch.amp.GradScaler``); ignored for bf16 and fp32."""

    init_scale: float = Field(default=65536.0, gt=0)
    """Initial loss scale (PyTorch's default, 2**16)."""
    growth_factor: float = Field(default=2.0, gt=1)
    """Factor the scale grows by after ``growth_interval`` clean steps."""
    backoff_factor: float = Field(default=0.5, gt=0, lt=1)
    """Factor the scale shrinks by on a step with inf/NaN gradients."""
    growth_interval: int = Field(default=2000, ge=1)
    """Clean steps between two growths."""


class TelemetrySpec(_Strict):
    flush_every_steps: int = Field(default=10, ge=1)
    """Per-step values stay on the device and reach the host once every this many steps..."""
    flush_every_ms: int = Field(default=500, ge=1)
    """...or after this many milliseconds, whichever comes first."""
    queue_size: int = Field(default=10_000, ge=1)
    """Records buffered for the sink; beyond that, records are dropped and counted, never waited for."""


class CheckpointSpec(_Strict):
    every_steps: int = Field(default=500, ge=1)
    """Write a checkpoint every this many optimizer steps (and at the end)."""
    keep_last: int = Field(default=3, ge=1)
    """Checkpoints kept; older ones are deleted after a newer one is safely written."""


class HealthSpec(_Strict):
    """The checks a careful AMP user runs by hand."""

    warn_loss_scale_below: float = Field(default=128.0, gt=0)
    """Warn ("frequent gradient overflow") when the fp16 loss scale falls below this."""
    warn_consecutive_skips: int = Field(default=5, ge=1)
    """Warn when this many consecutive optimizer steps were skipped for inf/NaN gradients."""
    diverge_nonfinite_steps: int = Field(default=3, ge=1)
    """bf16/fp32: stop as diverged after this many consecutive steps with a non-finite loss."""
    diverge_loss_scale_floor: float = Field(default=2.0**-14, gt=0)
    """fp16: stop as diverged when the loss scale falls below this floor."""


class JobSpec(_Strict):
    """A declarative training job. Only ``model``, ``dataset`` and ``max_steps`` are required."""

    name: str = Field(default="job", min_length=1, max_length=200)
    """Human-readable name shown in listings."""
    model: ComponentRef
    """The model to train, by registered name."""
    dataset: ComponentRef
    """The data to train on, by registered name."""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """Optimizer and its hyper-parameters."""
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    """Learning-rate schedule."""
    precision: Precision = "auto"
    """``auto`` picks bf16 on CUDA capability >= 8.0, fp16 + loss scaling on 7.x, fp32 elsewhere
    (bf16 on CPUs with AMX, or with avx512_bf16 where a short probe measures it faster).
    ``fp32`` is strict IEEE; ``tf32`` is fp32 with TF32 tensor-core matmuls and convolutions."""
    batch_size: int = Field(default=64, ge=1)
    """Effective batch size per optimizer step (micro-batch x ``grad_accum_steps``)."""
    grad_accum_steps: int = Field(default=1, ge=1)
    """Micro-batches accumulated per optimizer step; must divide ``batch_size``."""
    max_steps: int = Field(ge=1)
    """Optimizer steps to train for."""
    grad_clip_norm: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this (after unscaling); null disables clipping."""
    seed: int = Field(default=0, ge=0)
    """Seeds every random number generator; the same spec and seed give the same run."""
    device: DeviceKind = "auto"
    """``auto`` uses CUDA when the worker has it, else the CPU."""
    queue: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    """Worker queue to run on, e.g. ``gpu-a100`` for workers started with ``-Q gpu-a100``;
    default ``gpu``, or ``cpu`` when ``device`` is ``cpu``."""
    auto_micro_batch: bool = False
    """On CUDA out-of-memory, halve the micro-batch and double accumulation instead of failing."""
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

    @model_validator(mode="after")
    def _accumulation_divides_batch(self) -> JobSpec:
        if self.batch_size % self.grad_accum_steps:
            raise ValueError(
                f"grad_accum_steps ({self.grad_accum_steps}) must divide batch_size ({self.batch_size})"
            )
        return self

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps


def parse_spec(data: dict[str, Any]) -> JobSpec:
    """Validate a JSON-like dict; raises ``pydantic.ValidationError`` naming each bad field."""
    return JobSpec.model_validate(data)


SPEC_FILE_FORMATS = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
"""How a spec file is read, by suffix (any case); other suffixes are refused."""


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a spec file: JSON for ``.json``, YAML for ``.yaml``/``.yml``.

    Raises ``ValueError`` naming the file for another suffix, text that does not
    parse, or a document that is not a mapping (``OSError`` if it cannot be read).
    """
    path = Path(path)
    kind = SPEC_FILE_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"{path}: a spec file must end in {', '.join(SPEC_FILE_FORMATS)} (JSON or YAML)"
        )
    text = path.read_text()
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the spec must be a mapping (a JSON object)")
    return data
