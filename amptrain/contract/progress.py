"""What both command lines' progress lines show of a job's stream of metric points.

A step's own ``samples_per_second`` swings with whatever the host waited on in that step
(35 to 14,000 samples/s for one steady CPU job) and its loss with its batch, so a line
that shows the newest raw values reads as noise. :class:`ProgressView` shows instead:

- ``samples_per_second``: the *steady-state* throughput, the samples of the last
  :data:`STEADY_WINDOW` steps over their summed step times (a step's samples are its
  ``samples_per_second`` x ``step_time_ms``), so slow and fast steps weigh by the time
  they took, as a stopwatch over the window would;
- ``loss``: an exponential moving average with weight :data:`LOSS_SMOOTHING`, debiased
  (the first point is shown as it is, not pulled towards zero); a non-finite loss is
  shown as it is, so a divergence is never smoothed away.

Every other field is the newest point's. Torch-free: both command lines import it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, TypeGuard

STEADY_WINDOW = 100
"""Steps the steady-state samples/s is measured over."""
STEADY_RATE_DOC = (
    "Steady-state throughput: the samples of the attempt's last "
    f"{STEADY_WINDOW} recorded steps over their summed step times (samples_per_second x "
    "step_time_ms per step), so slow and fast steps weigh by the time they took; the same "
    "figure the command lines show."
)
"""What ``summary.samples_per_second`` is, everywhere a job's throughput is shown."""
LOSS_SMOOTHING = 0.9
"""Weight of the previous average in the loss's exponential moving average."""


class ProgressView:
    """Feed it each metric point in order (:meth:`add`); it returns the values to show."""

    def __init__(self) -> None:
        self._window: deque[tuple[float, float]] = deque(maxlen=STEADY_WINDOW)
        self._loss = 0.0
        self._weight = 0.0  # the debiasing denominator: 1 - LOSS_SMOOTHING ** n

    def add(self, point: dict[str, Any]) -> dict[str, Any]:
        shown = dict(point)
        rate, ms = point.get("samples_per_second"), point.get("step_time_ms")
        if _finite(rate) and _finite(ms) and ms > 0:
            self._window.append((rate * ms / 1000.0, ms / 1000.0))
        if self._window:
            shown["samples_per_second"] = sum(s for s, _ in self._window) / sum(
                t for _, t in self._window
            )
        loss = point.get("loss")
        if _finite(loss):
            self._loss = LOSS_SMOOTHING * self._loss + (1 - LOSS_SMOOTHING) * loss
            self._weight = LOSS_SMOOTHING * self._weight + (1 - LOSS_SMOOTHING)
            shown["loss"] = self._loss / self._weight
        return shown


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and math.isfinite(value)
