"""The checks a careful AMP user runs by hand, on the host values of each flush.

Detection lags by at most one flush (``telemetry.flush_every_steps`` steps or
``flush_every_ms``): the per-step values only reach the host then, and reading
them earlier would cost a device sync per step. The lag never changes the
numerics, only when a warning is sent or a diverged run is stopped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from amptrain.contract.errors import DivergedError, PrecisionFallbackError, TrainingError
from amptrain.contract.records import OVERFLOW_WARNING, SPIKE_WARNING, event
from amptrain.contract.spec import HealthSpec
from amptrain.engine.spikes import RollbackRequested
from amptrain.engine.step_records import Skip, Spike


class HealthMonitor:
    """Turns metric records into warning events, or the error that stops the run: a
    DivergedError that names the step, or (fp16 with a fallback) a PrecisionFallbackError."""

    def __init__(self, spec: HealthSpec, precision: str, fallback_to: str | None = None) -> None:
        """``fallback_to``: the precision an unhealthy fp16 run falls back to (None: it
        fails); see :func:`fallback_target`."""
        self._spec = spec
        self._fp16 = precision == "fp16"
        self._precision = precision
        self._fallback_to = fallback_to if self._fp16 else None
        self._consecutive_skips = 0
        self._consecutive_nonfinite = 0
        self._low_scale_steps = 0
        self._low_scale_warned = False
        self._rollback_step: int | None = None  # the first spike read, not yet handed out
        self._last_param: str | None = None

    @property
    def healthy(self) -> bool:
        """No trigger is building up at the newest step checked: it was not skipped for
        inf/NaN, its loss was finite and the loss scale above its floor. A checkpoint
        written now carries this mark; a fallback resumes only from a healthy one."""
        return not (self._consecutive_skips or self._consecutive_nonfinite or self._low_scale_steps)

    def check(
        self,
        records: list[dict[str, Any]],
        skips: Mapping[int, Skip] | None = None,
        spikes: Mapping[int, Spike] | None = None,
    ) -> tuple[list[dict[str, Any]], TrainingError | None]:
        """Warning events for ``records`` (in order), and the divergence error if any.
        ``skips``: the overflow attribution of the skipped steps, by step; ``spikes``: the
        steps the spike check flagged, by step."""
        events: list[dict[str, Any]] = []
        for rec in records:
            skip = (skips or {}).get(rec["step"])
            if skip is not None:
                self._last_param = skip.param
                events.append(self._overflow_warning(rec, skip))
            spike = (spikes or {}).get(rec["step"])
            if spike is not None:
                events.append(self._spike_warning(rec, spike))
            error = self._check_one(rec, events, overflowed=spike is None or skip is not None)
            if error is not None:
                return events, error
        return events, None

    def take_rollback(self) -> RollbackRequested | None:
        """``action: rollback``: the rollback the spikes read so far ask for (the first of
        them), handed out once; telemetry raises it after offering their records."""
        step, self._rollback_step = self._rollback_step, None
        return None if step is None else RollbackRequested(step)

    def _check_one(
        self, rec: dict[str, Any], events: list[dict[str, Any]], *, overflowed: bool = True
    ) -> TrainingError | None:
        step = rec["step"]
        # A spike withheld by ``spike.action: skip`` is skipped too, but not for inf/NaN.
        if rec["skipped"] and overflowed:
            self._consecutive_skips += 1
            if self._consecutive_skips == self._spec.warn_consecutive_skips:
                events.append(
                    self._warning(
                        rec,
                        "consecutive_skips",
                        (
                            f"{self._consecutive_skips} consecutive steps up to step {step} were skipped "
                            "for inf/NaN gradients"
                        ),
                    )
                )
        else:
            self._consecutive_skips = 0
        if not self._fp16:
            return self._check_loss(rec)
        limit = self._spec.max_consecutive_skips
        if limit is not None and self._consecutive_skips > limit:
            return self._unhealthy(
                "consecutive_skips",
                step,
                f"{self._consecutive_skips} consecutive steps up to step {step} were skipped for "
                f"inf/NaN gradients (more than max_consecutive_skips {limit})",
            )
        if self._fallback_to is not None and (error := self._check_loss(rec)) is not None:
            return error
        return self._check_scale(rec, events)

    def _unhealthy(self, trigger: str, step: int, what: str) -> TrainingError:
        """fp16 is unhealthy: the fallback, or the failure naming the step."""
        if self._fallback_to is not None:
            return PrecisionFallbackError(
                f"fp16 became unhealthy at step {step}: {what}; falling back to "
                f"{self._fallback_to} from the newest healthy checkpoint",
                step=step,
                trigger=trigger,
                to=self._fallback_to,
                param=self._last_param,
            )
        return DivergedError(
            f"diverged at step {step}: {what}. The model likely needs more range than fp16 "
            "has: use precision 'bf16' (CUDA capability >= 8.0) or 'fp32', set "
            "health.fallback, or lower the learning rate.",
            step=step,
        )

    def _check_scale(
        self, rec: dict[str, Any], events: list[dict[str, Any]]
    ) -> TrainingError | None:
        scale, step = rec["loss_scale"], rec["step"]
        if scale is None:
            return None
        floor = self._spec.diverge_loss_scale_floor
        self._low_scale_steps = self._low_scale_steps + 1 if scale < floor else 0
        if self._low_scale_steps >= self._spec.loss_scale_floor_steps:
            return self._unhealthy(
                "loss_scale_floor",
                step,
                f"the fp16 loss scale fell to {scale:g}, below the floor {floor:g}"
                + (f" for {self._low_scale_steps} steps" if self._low_scale_steps > 1 else "")
                + ", so gradients overflow on nearly every step",
            )
        if scale < self._spec.warn_loss_scale_below and not self._low_scale_warned:
            self._low_scale_warned = True
            events.append(
                self._warning(
                    rec,
                    "low_loss_scale",
                    (
                        f"frequent gradient overflow: the fp16 loss scale fell to {scale:g} at step {step} "
                        f"(below {self._spec.warn_loss_scale_below:g}); consider bf16 if the device has it"
                    ),
                )
            )
        elif scale >= self._spec.warn_loss_scale_below:
            self._low_scale_warned = False  # re-arm once the scale has recovered
        return None

    def _check_loss(self, rec: dict[str, Any]) -> TrainingError | None:
        loss, step = rec["loss"], rec["step"]
        if loss is not None and math.isfinite(loss):
            self._consecutive_nonfinite = 0
            return None
        self._consecutive_nonfinite += 1
        if self._consecutive_nonfinite < self._spec.diverge_nonfinite_steps:
            return None
        if self._fp16:
            return self._unhealthy(
                "nonfinite_loss",
                step,
                f"the loss was non-finite for {self._consecutive_nonfinite} consecutive steps",
            )
        return DivergedError(
            f"diverged at step {step}: the loss was non-finite for {self._consecutive_nonfinite} "
            f"consecutive steps ({self._precision}). Lower the learning rate, enable or tighten "
            "grad_clip_norm, or check the data for NaN/inf values.",
            step=step,
        )

    @classmethod
    def _overflow_warning(cls, rec: dict[str, Any], skip: Skip) -> dict[str, Any]:
        if skip.param is None:
            where = "no parameter's gradient norm was inf/NaN"
        else:
            where = (
                f"the first non-finite gradient in backward order was {skip.param} ({skip.norm})"
            )
        message = f"step {skip.step} skipped for inf/NaN gradients: {where}"
        return cls._warning(rec, OVERFLOW_WARNING, message, param=skip.param, norm=skip.norm)

    def _spike_warning(self, rec: dict[str, Any], spike: Spike) -> dict[str, Any]:
        rule = self._spec.spike
        assert rule is not None  # spikes are only found with the check on
        done = {
            "warn": "",
            "skip": "; its update was skipped",
            "rollback": "; its update was skipped (action rollback: see the rollback event)",
        }
        if rule.action == "rollback" and self._rollback_step is None:
            self._rollback_step = spike.step
        message = (
            f"{rule.metric} spike at step {spike.step}: {spike.value:.6g} is more than "
            f"{rule.z:g} standard deviations above the mean of the last {rule.window} steps "
            f"({spike.mean:.6g} ± {spike.std:.6g}){done[rule.action]}"
        )
        return self._warning(
            rec,
            SPIKE_WARNING,
            message,
            metric=rule.metric,
            value=spike.value,
            mean=spike.mean,
            std=spike.std,
            z=rule.z,
            action=rule.action,
        )

    @staticmethod
    def _warning(rec: dict[str, Any], code: str, message: str, **data: Any) -> dict[str, Any]:
        return event("warning", rec["step"], rec["time"], code=code, message=message, **data)
