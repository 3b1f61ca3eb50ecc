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

from amptrain.contract.errors import DivergedError
from amptrain.contract.records import OVERFLOW_WARNING, SPIKE_WARNING, event
from amptrain.contract.spec import HealthSpec
from amptrain.engine.step_records import Skip, Spike


class HealthMonitor:
    """Turns metric records into warning events, or a DivergedError that names the step."""

    def __init__(self, spec: HealthSpec, precision: str) -> None:
        self._spec = spec
        self._fp16 = precision == "fp16"
        self._precision = precision
        self._consecutive_skips = 0
        self._consecutive_nonfinite = 0
        self._low_scale_warned = False

    def check(
        self,
        records: list[dict[str, Any]],
        skips: Mapping[int, Skip] | None = None,
        spikes: Mapping[int, Spike] | None = None,
    ) -> tuple[list[dict[str, Any]], DivergedError | None]:
        """Warning events for ``records`` (in order), and the divergence error if any.
        ``skips``: the overflow attribution of the skipped steps, by step; ``spikes``: the
        steps the spike check flagged, by step."""
        events: list[dict[str, Any]] = []
        for rec in records:
            skip = (skips or {}).get(rec["step"])
            if skip is not None:
                events.append(self._overflow_warning(rec, skip))
            spike = (spikes or {}).get(rec["step"])
            if spike is not None:
                events.append(self._spike_warning(rec, spike))
            error = self._check_one(rec, events, overflowed=spike is None or skip is not None)
            if error is not None:
                return events, error
        return events, None

    def _check_one(
        self, rec: dict[str, Any], events: list[dict[str, Any]], *, overflowed: bool = True
    ) -> DivergedError | None:
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
        if self._fp16:
            return self._check_scale(rec, events)
        return self._check_loss(rec)

    def _check_scale(
        self, rec: dict[str, Any], events: list[dict[str, Any]]
    ) -> DivergedError | None:
        scale, step = rec["loss_scale"], rec["step"]
        if scale is None:
            return None
        if scale < self._spec.diverge_loss_scale_floor:
            return DivergedError(
                f"diverged at step {step}: the fp16 loss scale fell to {scale:g}, below the floor "
                f"{self._spec.diverge_loss_scale_floor:g}, so gradients overflow on nearly every step. "
                "The model likely needs more range than fp16 has: use precision 'bf16' "
                "(CUDA capability >= 8.0) or 'fp32', or lower the learning rate.",
                step=step,
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

    def _check_loss(self, rec: dict[str, Any]) -> DivergedError | None:
        loss, step = rec["loss"], rec["step"]
        if loss is not None and math.isfinite(loss):
            self._consecutive_nonfinite = 0
            return None
        self._consecutive_nonfinite += 1
        if self._consecutive_nonfinite < self._spec.diverge_nonfinite_steps:
            return None
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
        done = {"warn": "", "skip": "; its update was skipped"}
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
