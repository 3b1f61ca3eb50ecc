"""The guardian's verdicts, and the decision table that picks one (pure: no model, no I/O).

After every telemetry flush the guardian (:class:`~amptrain.engine.guardian.Guardian`)
returns ONE verdict on the steps that flush read; the Trainer acts on it at the next step
boundary, in one place. Telemetry publishes the flush's records with the verdict's
warnings and, once a verdict ended the run, no record of a step after the one it names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amptrain.contract.errors import DivergedError, PrecisionFallbackError

Event = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Continue:
    """Train on. With ``warnings`` this is *warn*: the events go out with the flush's records."""

    warnings: tuple[Event, ...] = ()

    @property
    def ends_at(self) -> int | None:
        """The step the run ends at (None: it goes on); no record after it is published."""
        return None


@dataclass(frozen=True, kw_only=True)
class RollBack:
    """``health.spike.action: rollback``: go back to the healthy checkpoint of step
    ``checkpoint`` (at or before the spike), keeping the step count; None: there is none, the
    spike's update stays withheld and training goes on (the event says so)."""

    spike_step: int
    checkpoint: int | None
    warnings: tuple[Event, ...] = ()

    @property
    def ends_at(self) -> int | None:
        return None


@dataclass(frozen=True, kw_only=True)
class FallBack:
    """fp16 became unhealthy at ``step`` and ``health.fallback`` names a precision: the
    attempt ends, the next resumes in ``fallback_to`` from the newest healthy checkpoint."""

    step: int
    trigger: str
    fallback_to: str
    param: str | None
    """The first non-finite gradient's parameter of the newest skipped step, if known."""
    message: str
    warnings: tuple[Event, ...] = ()

    @property
    def ends_at(self) -> int | None:
        return self.step

    def error(self) -> PrecisionFallbackError:
        return PrecisionFallbackError(
            self.message,
            step=self.step,
            trigger=self.trigger,
            fallback_to=self.fallback_to,
            param=self.param,
        )


@dataclass(frozen=True, kw_only=True)
class Diverged:
    """The run cannot go on: it fails at ``step``, and its history ends there."""

    step: int
    message: str
    warnings: tuple[Event, ...] = ()

    @property
    def ends_at(self) -> int | None:
        return self.step

    def error(self) -> DivergedError:
        return DivergedError(self.message, step=self.step)


Verdict = Continue | RollBack | FallBack | Diverged


def sooner(first: Verdict, then: Verdict) -> Verdict:
    """The verdict to act on after two flushes in a row with no step boundary between them
    (an out-of-memory retry's event, then the step's own flush): the first that asks for more
    than going on. A run that ended stays ended (the guardian repeats that verdict); a
    rollback acted on covers any later spike up to the step it is taken at."""
    return then if isinstance(first, Continue) else first


@dataclass(frozen=True)
class Trigger:
    """A check that stops training, as found in one step's record."""

    step: int
    trigger: str
    """``consecutive_skips``, ``loss_scale_floor`` or ``nonfinite_loss``."""
    what: str
    """What happened, in words (the message's middle)."""
    fp16: bool
    """Found in an fp16 run: ``health.fallback`` may leave fp16 for it."""


@dataclass(frozen=True)
class Situation:
    """What the decision needs beyond the flush: where the run is and what it has done."""

    at: int
    """The newest step trained (where a verdict is acted on)."""
    rollbacks: int
    """Rollbacks the job has taken."""
    rolled_back_at: int | None
    """The step the latest rollback was taken at."""
    newest_healthy: Callable[[int], int | None]
    """The newest healthy checkpoint at or before a step (the checkpoint manager's lookup)."""


@dataclass(frozen=True)
class SpikePolicy:
    """``health.spike`` as the decision needs it (None in :func:`decide`: no rollbacks)."""

    metric: str
    max_rollbacks: int


def decide(
    *,
    ended: Verdict | None,
    trigger: Trigger | None,
    spike: int | None,
    warnings: tuple[Event, ...],
    situation: Situation,
    fallback_to: str | None,
    rollback: SpikePolicy | None,
    last_param: str | None = None,
) -> Verdict:
    """The one verdict on a flush, by this table, first match wins:

    1. the run already ended: the same verdict again (nothing after its step);
    2. a trigger in an fp16 run with a fallback: :class:`FallBack`;
    3. any other trigger: :class:`Diverged` at its step (a diverged run has nothing to roll
       back to);
    4. the first spike read under ``action: rollback`` (``spike``), unless the latest rollback
       was taken at or after its step (it trained on weights that rollback threw away): with
       no healthy checkpoint at or before it, a :class:`RollBack` to none; past
       ``max_rollbacks``, :class:`Diverged` at the step acted on; else a :class:`RollBack`;
    5. warnings: :class:`Continue` with them (warn); else :class:`Continue`.
    """
    if ended is not None:
        return dataclasses.replace(ended, warnings=())
    if trigger is not None:
        return _stop(trigger, fallback_to, last_param, warnings)
    since = situation.rolled_back_at
    if spike is not None and rollback is not None and (since is None or spike > since):
        checkpoint = situation.newest_healthy(spike)
        if checkpoint is not None and situation.rollbacks >= rollback.max_rollbacks:
            at = situation.at
            return Diverged(
                step=at,
                message=(
                    f"diverged at step {at}: a {rollback.metric} spike at step {spike} after "
                    f"{situation.rollbacks} rollbacks (health.spike.max_rollbacks "
                    f"{rollback.max_rollbacks}). Lower the learning rate, enable or tighten "
                    f"grad_clip_norm, or check the data around step {spike}."
                ),
                warnings=warnings,
            )
        return RollBack(spike_step=spike, checkpoint=checkpoint, warnings=warnings)
    return Continue(warnings=warnings)


def _stop(
    trigger: Trigger, fallback_to: str | None, param: str | None, warnings: tuple[Event, ...]
) -> Verdict:
    step, what = trigger.step, trigger.what
    if trigger.fp16 and fallback_to is not None:
        return FallBack(
            step=step,
            trigger=trigger.trigger,
            fallback_to=fallback_to,
            param=param,
            message=(
                f"fp16 became unhealthy at step {step}: {what}; falling back to {fallback_to} "
                "from the newest healthy checkpoint"
            ),
            warnings=warnings,
        )
    if trigger.fp16:
        advice = (
            "The model likely needs more range than fp16 has: use precision 'bf16' (CUDA "
            "capability >= 8.0) or 'fp32', set health.fallback, or lower the learning rate."
        )
    else:
        advice = (
            "Lower the learning rate, enable or tighten grad_clip_norm, or check the data for "
            "NaN/inf values."
        )
    return Diverged(
        step=step, message=f"diverged at step {step}: {what}. {advice}", warnings=warnings
    )
