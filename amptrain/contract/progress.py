"""What both command lines' progress lines show of a job's stream of metric points.

A step's own ``samples_per_second`` swings with whatever the host waited on in that step
(35 to 14,000 samples/s for one steady CPU job) and its loss with its batch, so a line
that shows the newest raw values reads as noise. :class:`ProgressView` shows instead:

- ``samples_per_second``: the *steady-state* throughput (:func:`steady_rate`, the one
  definition: the command lines, ``summary.samples_per_second``, the job list and the
  comparison report all use it);
- ``loss``: an exponential moving average with weight :data:`LOSS_SMOOTHING`, debiased
  (the first point is shown as it is, not pulled towards zero); a non-finite loss is
  shown as it is, so a divergence is never smoothed away.

Every other field is the newest point's. Torch-free: both command lines import it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import count
from typing import Any, TypeGuard

from amptrain.contract.metrics import BY_NAME, SUMMARY_FIELDS, show

STEADY_WINDOW = 100
"""Steps the steady-state samples/s is measured over (at most)."""
WARMUP_FRACTION = 0.1
"""The first fraction of an attempt's steps that never counts as steady state (compilation,
allocator warm-up, the first loss-scale backoffs): a 50-step run's rate is its last 45."""
STEADY_RATE_DOC = (
    "Steady-state throughput: the samples of the attempt's last "
    f"{STEADY_WINDOW} recorded steps (never its first {WARMUP_FRACTION:.0%}) over their "
    "summed step times (samples_per_second x step_time_ms per step), so slow and fast "
    "steps weigh by the time they took; the same figure the command lines, the job list "
    "and the comparison report show."
)
"""What ``summary.samples_per_second`` is, everywhere a job's throughput is shown."""
LOSS_SMOOTHING = 0.9
"""Weight of the previous average in the loss's exponential moving average."""


def steady_window(steps: int) -> int:
    """How many of an attempt's newest ``steps`` (those with a rate and a step time) the
    steady-state rate is measured over: all but the warm-up, at most STEADY_WINDOW."""
    return min(STEADY_WINDOW, steps - int(steps * WARMUP_FRACTION))


STEADY_LOOKBACK = next(n for n in count(STEADY_WINDOW) if steady_window(n) >= STEADY_WINDOW)
"""Newest steps a reader fetches to know the steady rate (111): with fewer than these the
reader has them all, so their number is the attempt's; with these, the window is full."""


def steady_rate(newest: Sequence[tuple[float, float]], steps: int) -> float | None:
    """THE steady-state samples/s (:data:`STEADY_RATE_DOC`), from the ``(samples_per_second,
    step_time_ms)`` of an attempt's newest steps (any order; at least the last
    ``steady_window(steps)``) and ``steps``, how many such steps it has in all; None
    without one. Steps without a finite rate or a positive time are not given."""
    window = list(newest)[-steady_window(steps) :] if steps else []
    seconds = sum(ms for _, ms in window) / 1000.0
    return sum(rate * ms for rate, ms in window) / 1000.0 / seconds if seconds > 0 else None


class ProgressView:
    """Feed it each metric point in order (:meth:`add`); it returns the values to show."""

    def __init__(self) -> None:
        self._window: deque[tuple[float, float]] = deque(maxlen=STEADY_WINDOW)
        self._steps = 0  # steps with a usable rate so far (the warm-up is a fraction of them)
        self._loss = 0.0
        self._weight = 0.0  # the debiasing denominator: 1 - LOSS_SMOOTHING ** n

    def add(self, point: dict[str, Any]) -> dict[str, Any]:
        shown = dict(point)
        rate, ms = point.get("samples_per_second"), point.get("step_time_ms")
        if _finite(rate) and _finite(ms) and ms > 0:
            self._window.append((rate, ms))
            self._steps += 1
        if self._window:
            shown["samples_per_second"] = steady_rate(self._window, self._steps)
        loss = point.get("loss")
        if _finite(loss):
            self._loss = LOSS_SMOOTHING * self._loss + (1 - LOSS_SMOOTHING) * loss
            self._weight = LOSS_SMOOTHING * self._weight + (1 - LOSS_SMOOTHING)
            shown["loss"] = self._loss / self._weight
        return shown


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and math.isfinite(value)


LAST_LOSS_LABEL = "last loss"
"""How ``amptrain jobs`` and ``amptrain train``'s last line label the newest step's own
(raw) loss, ``summary.loss``: the figure the API returns."""
LAST_LOSS_DOC = (
    "The newest recorded step's own loss, raw (not smoothed; the command lines' progress "
    f"bar shows a moving average, labelled {'smoothed loss'!r}): what `amptrain jobs` "
    f"shows as {LAST_LOSS_LABEL!r}."
)
"""What ``summary.loss`` is."""
SMOOTHED_LOSS_LABEL = "smoothed loss"
"""How a progress line labels the moving average it shows instead of the step's own loss
(:class:`~amptrain.contract.progress.ProgressView`): ``amptrain jobs`` and the API's
``summary.loss`` show the newest step's raw loss (:data:`LAST_LOSS_LABEL`)."""


def progress_line(
    values: dict[str, Any], width: int | None = None, smoothed_loss: bool = False
) -> str:
    """The summary fields of a record, as both command lines show them; the last fields
    are left out until the line fits ``width`` characters (the first always stays).
    ``smoothed_loss``: ``values["loss"]`` is the moving average, and says so."""
    shown = [n for n in SUMMARY_FIELDS if values.get(n) is not None or not BY_NAME[n].optional]
    parts = [show(name, values.get(name)) for name in shown]
    if smoothed_loss and "loss" in shown:
        label = BY_NAME["loss"].label or "loss"
        at = shown.index("loss")
        parts[at] = SMOOTHED_LOSS_LABEL + parts[at].removeprefix(label)
    while width is not None and len(parts) > 1 and len(" · ".join(parts)) > width:
        parts.pop()
    return " · ".join(parts)
