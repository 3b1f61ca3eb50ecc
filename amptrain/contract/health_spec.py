"""The numerics guardian's settings in a job spec (``health``): the checks a careful AMP
user runs by hand, and the loss-spike rule. Part of :mod:`amptrain.contract.spec`, which
re-exports them; torch-free like it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_STEPS = 10_000_000
"""Upper bound of ``max_steps`` (and of every step count): far below PostgreSQL's int4
columns, and the engine keeps a per-step learning-rate table on the device."""

Fallback = Literal["none", "auto", "bf16", "fp32"]


class StrictModel(BaseModel):
    """Every part of a spec: unknown fields refused, field docstrings in the schema, frozen,
    finite floats only."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, frozen=True, allow_inf_nan=False
    )


MAX_SPIKE_WINDOW = 10_000
"""Largest ``health.spike.window``: the window is a device buffer the step reduces every step."""


class SpikeSpec(StrictModel):
    """A loss (or gradient-norm) spike rule, checked on the device every step with no host
    read: a value more than ``z`` standard deviations above the mean of the last ``window``
    values is a spike. A spike never enters the window (nor does a non-finite value)."""

    metric: Literal["loss", "grad_norm"] = "loss"
    """The per-step value checked: the step's mean loss, or its global gradient norm (after
    unscaling, before clipping)."""
    window: int = Field(default=100, ge=8, le=MAX_SPIKE_WINDOW)
    """Rolling window: the last this many accepted values give the mean and the standard
    deviation (population: divided by the count)."""
    z: float = Field(default=6.0, gt=0, le=1000)
    """A spike: the value exceeds the window's mean by more than this many standard
    deviations."""
    warmup_steps: int = Field(default=20, ge=2, le=MAX_SPIKE_WINDOW)
    """No check until the window holds this many values (at most ``window``)."""
    action: Literal["warn", "skip", "rollback"] = "warn"
    """``warn``: a ``loss_spike`` warning event. ``skip``: the spiking step's optimizer
    update is not applied (on the device, as an fp16 overflow step is skipped; it is recorded
    as ``skipped`` and the schedule holds still), plus the warning. ``rollback``: ``skip``,
    then the run goes back to the newest checkpoint at or before the spike (not its step
    count: the batches since are skipped); see the README. Needs ``checkpoint.every_steps``
    below ``max_steps``."""
    max_rollbacks: int = Field(default=3, ge=1, le=100)
    """``rollback``: rollbacks a job may take; the spike after the last one fails the job as
    ``diverged``, naming its step."""

    @property
    def withholds(self) -> bool:
        """A spike's update is withheld on the device (``skip``, ``rollback``)."""
        return self.action != "warn"

    @model_validator(mode="after")
    def _warmup_fits_window(self) -> SpikeSpec:
        if self.warmup_steps > self.window:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be at most window ({self.window}): "
                "the window never holds more values than its size"
            )
        return self


class HealthSpec(StrictModel):
    """The checks a careful AMP user runs by hand."""

    spike: SpikeSpec | None = None
    """Loss-spike detection (see its fields); null: off, costing nothing."""

    warn_loss_scale_below: float = Field(default=128.0, gt=0, le=2.0**32)
    """Warn ("frequent gradient overflow") when the fp16 loss scale falls below this."""
    warn_consecutive_skips: int = Field(default=5, ge=1, le=MAX_STEPS)
    """Warn when this many consecutive optimizer steps were skipped for inf/NaN gradients."""
    diverge_nonfinite_steps: int = Field(default=3, ge=1, le=MAX_STEPS)
    """Stop as diverged after this many consecutive steps with a non-finite loss (fp16: only
    as a ``fallback`` trigger; without one, fp16 fails on the loss scale instead)."""
    diverge_loss_scale_floor: float = Field(default=2.0**-14, gt=0, le=2.0**32)
    """fp16: unhealthy (``fallback``, or the job fails) when the loss scale stays below this
    floor for ``loss_scale_floor_steps`` consecutive steps."""
    loss_scale_floor_steps: int = Field(default=1, ge=1, le=MAX_STEPS)
    """fp16: see ``diverge_loss_scale_floor``."""
    max_consecutive_skips: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    """fp16: unhealthy after more than this many consecutive steps skipped for inf/NaN
    gradients; null: no such trigger."""
    fallback: Fallback | None = None
    """What an unhealthy fp16 run does: ``none`` fails naming the step; ``bf16``, ``fp32``
    or ``auto`` (bf16 where the device has it, else fp32) ends the attempt, and the job
    resumes in that precision from its newest checkpoint written while healthy (from the
    start without one), not counted as a failed attempt. Null: ``auto`` when
    ``precision: auto`` chose fp16, ``none`` for an explicit fp16."""
