"""The checks a careful AMP user runs by hand, over the host values of each flush.

Detection lags by at most one flush (``telemetry.flush_every_steps`` steps or
``flush_every_ms``; on one GPU one more, since a due flush reads the window before the
newest): the per-step values only reach the host then, and reading them earlier would cost
a device sync per step. The lag never changes the numerics, only when a warning is sent,
a run is stopped or a rollback taken; and :func:`~amptrain.engine.guardian.verdict.decide`
treats a late-read step by the same rule as an early-read one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amptrain.contract.records import OVERFLOW_WARNING, SPIKE_WARNING, event
from amptrain.contract.spec import HealthSpec
from amptrain.engine.guardian.verdict import (
    Event,
    Situation,
    SpikePolicy,
    Trigger,
    Verdict,
    decide,
)
from amptrain.engine.step_records import Skip, Spike


@dataclass(frozen=True)
class Reading:
    """What one flush read, in step order."""

    records: list[dict[str, Any]]
    """The ``metric`` records."""
    skips: Mapping[int, Skip] = field(default_factory=dict)
    """The overflow attribution of the skipped steps among them, by step."""
    spikes: Mapping[int, Spike] = field(default_factory=dict)
    """The steps the spike check flagged, by step."""


class Guardian:
    """Turns each flush's records into warnings and one verdict (see ``verdict.decide``).

    Its own state is the triggers building up (consecutive skipped steps, non-finite losses,
    steps with the loss scale below its floor) and, once a verdict ended the run, that
    verdict: every later flush gets it again, so nothing after its step is published."""

    def __init__(self, spec: HealthSpec, precision: str, fallback_to: str | None = None) -> None:
        """``fallback_to``: the precision an unhealthy fp16 run falls back to (None: it
        fails); see :func:`~amptrain.engine.fallback.fallback_target`."""
        self._spec = spec
        self._fp16 = precision == "fp16"
        self._precision = precision
        self._fallback_to = fallback_to if self._fp16 else None
        rule = spec.spike
        self._rollback = (
            SpikePolicy(rule.metric, rule.max_rollbacks)
            if rule is not None and rule.action == "rollback"
            else None
        )
        self._consecutive_skips = 0
        self._consecutive_nonfinite = 0
        self._low_scale_steps = 0
        self._low_scale_warned = False
        self._last_param: str | None = None
        self._ended: Verdict | None = None

    @property
    def healthy(self) -> bool:
        """No trigger is building up at the newest step checked: it was not skipped for
        inf/NaN, its loss was finite and the loss scale above its floor. A checkpoint
        written now carries this mark; a fallback or a rollback goes back only to one."""
        return not (self._consecutive_skips or self._consecutive_nonfinite or self._low_scale_steps)

    def judge(self, reading: Reading, situation: Situation) -> Verdict:
        """The verdict on one flush's ``reading``, with the warnings to publish beside it."""
        if self._ended is not None:  # rule 1 of the table, without running the checks again
            return dataclasses.replace(self._ended, warnings=())
        events: list[Event] = []
        trigger: Trigger | None = None
        first_spike: int | None = None
        since = situation.rolled_back_at
        # One spike warning a flush stands for all its spikes: a low ``z`` flagged nearly
        # every step, and 968 warnings in 1,000 steps buried every other event.
        spikes: list[Spike] = []
        spike_at: tuple[int, dict[str, Any]] | None = None  # (index in events, record)
        for rec in reading.records:
            skip = reading.skips.get(rec["step"])
            if skip is not None:
                self._last_param = skip.param
                events.append(_overflow_warning(rec, skip))
            spike = reading.spikes.get(rec["step"])
            if spike is not None:
                if not spikes:
                    spike_at = (len(events), rec)
                spikes.append(spike)
                if first_spike is None and (since is None or spike.step > since):
                    first_spike = spike.step
            trigger = self._check_one(rec, events, overflowed=spike is None or skip is not None)
            if trigger is not None:
                break
        if spike_at is not None:
            events.insert(spike_at[0], self._spike_warning(spike_at[1], spikes))
        verdict = decide(
            ended=None,
            trigger=trigger,
            spike=first_spike,
            warnings=tuple(events),
            situation=situation,
            fallback_to=self._fallback_to,
            rollback=self._rollback,
            last_param=self._last_param,
        )
        if verdict.ends_at is not None:
            self._ended = verdict
        return verdict

    def _check_one(
        self, rec: dict[str, Any], events: list[Event], *, overflowed: bool = True
    ) -> Trigger | None:
        step = rec["step"]
        # A spike withheld by ``spike.action: skip`` is skipped too, but not for inf/NaN.
        if rec["skipped"] and overflowed:
            self._consecutive_skips += 1
            if self._consecutive_skips == self._spec.warn_consecutive_skips:
                events.append(
                    _warning(
                        rec,
                        "consecutive_skips",
                        f"{self._consecutive_skips} consecutive steps up to step {step} were "
                        "skipped for inf/NaN gradients",
                    )
                )
        else:
            self._consecutive_skips = 0
        if not self._fp16:
            return self._check_loss(rec)
        limit = self._spec.max_consecutive_skips
        if limit is not None and self._consecutive_skips > limit:
            return Trigger(
                step,
                "consecutive_skips",
                f"{self._consecutive_skips} consecutive steps up to step {step} were skipped "
                f"for inf/NaN gradients (more than max_consecutive_skips {limit})",
                fp16=True,
            )
        if self._fallback_to is not None and (found := self._check_loss(rec)) is not None:
            return found
        return self._check_scale(rec, events)

    def _check_scale(self, rec: dict[str, Any], events: list[Event]) -> Trigger | None:
        scale, step = rec["loss_scale"], rec["step"]
        if scale is None:
            return None
        floor = self._spec.diverge_loss_scale_floor
        self._low_scale_steps = self._low_scale_steps + 1 if scale < floor else 0
        if self._low_scale_steps >= self._spec.loss_scale_floor_steps:
            return Trigger(
                step,
                "loss_scale_floor",
                f"the fp16 loss scale fell to {scale:g}, below the floor {floor:g}"
                + (f" for {self._low_scale_steps} steps" if self._low_scale_steps > 1 else "")
                + ", so gradients overflow on nearly every step",
                fp16=True,
            )
        below = self._spec.warn_loss_scale_below
        if scale < below and not self._low_scale_warned:
            self._low_scale_warned = True
            events.append(
                _warning(
                    rec,
                    "low_loss_scale",
                    f"frequent gradient overflow: the fp16 loss scale fell to {scale:g} at step "
                    f"{step} (below {below:g}); consider bf16 if the device has it",
                )
            )
        elif scale >= below:
            self._low_scale_warned = False  # re-arm once the scale has recovered
        return None

    def _check_loss(self, rec: dict[str, Any]) -> Trigger | None:
        loss, step = rec["loss"], rec["step"]
        if loss is not None and math.isfinite(loss):
            self._consecutive_nonfinite = 0
            return None
        self._consecutive_nonfinite += 1
        if self._consecutive_nonfinite < self._spec.diverge_nonfinite_steps:
            return None
        what = f"the loss was non-finite for {self._consecutive_nonfinite} consecutive steps"
        if not self._fp16:
            what += f" ({self._precision})"
        return Trigger(step, "nonfinite_loss", what, fp16=self._fp16)

    def _spike_warning(self, rec: dict[str, Any], spikes: list[Spike]) -> Event:
        """The one warning of a flush's ``spikes`` (in step order), at the first: its value,
        mean and std, and ``count``, ``first_step`` and ``last_step`` of them all."""
        spike, last = spikes[0], spikes[-1]
        rule = self._spec.spike
        assert rule is not None  # spikes are only found with the check on
        done = {
            "warn": "",
            "skip": "; its update was skipped",
            "rollback": "; its update was skipped (action rollback: see the rollback event)",
        }
        message = (
            f"{rule.metric} spike at step {spike.step}: {spike.value:.6g} is more than "
            f"{rule.z:g} standard deviations above the mean of the last {rule.window} steps "
            f"({spike.mean:.6g} ± {spike.std:.6g}){done[rule.action]}"
        )
        if len(spikes) > 1:
            message += f" (and {len(spikes) - 1} more spikes up to step {last.step})"
        return _warning(
            rec,
            SPIKE_WARNING,
            message,
            metric=rule.metric,
            value=spike.value,
            mean=spike.mean,
            std=spike.std,
            z=rule.z,
            action=rule.action,
            count=len(spikes),
            first_step=spike.step,
            last_step=last.step,
        )


def _overflow_warning(rec: dict[str, Any], skip: Skip) -> Event:
    if skip.param is None:
        where = "no parameter's gradient norm was inf/NaN"
    else:
        where = f"the first non-finite gradient in backward order was {skip.param} ({skip.norm})"
    message = f"step {skip.step} skipped for inf/NaN gradients: {where}"
    return _warning(rec, OVERFLOW_WARNING, message, param=skip.param, norm=skip.norm)


def _warning(rec: dict[str, Any], code: str, message: str, **data: Any) -> Event:
    return event("warning", rec["step"], rec["time"], code=code, message=message, **data)
