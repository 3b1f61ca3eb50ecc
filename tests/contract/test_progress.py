"""The progress lines' numbers: steady-state samples/s over a window and a smoothed loss."""

from __future__ import annotations

import math

import pytest

from amptrain.contract.progress import (
    LOSS_SMOOTHING,
    STEADY_LOOKBACK,
    STEADY_WINDOW,
    ProgressView,
    steady_rate,
    steady_window,
)


def point(step: int, loss: float, samples: int, ms: float) -> dict[str, float]:
    return {
        "step": step,
        "loss": loss,
        "samples_per_second": samples / (ms / 1000),
        "step_time_ms": ms,
    }


def test_samples_per_second_is_the_windows_samples_over_its_time() -> None:
    view = ProgressView()
    # 32 samples a step; every other step waited 100x longer (what the host happened to wait
    # on): the raw per-step rate jumps between 32,000 and 320 samples/s.
    shown = [view.add(point(i, 1.0, 32, 1.0 if i % 2 else 100.0)) for i in range(1, 11)]
    # The first 10% (step 1, a fast one) is warm-up: steps 2-10, five slow and four fast.
    assert shown[-1]["samples_per_second"] == pytest.approx(288 / (4 * 1.0 + 5 * 100.0) * 1000)
    assert shown[-1]["step"] == 10 and shown[-1]["step_time_ms"] == 100.0  # the rest as is
    # Only the last STEADY_WINDOW steps count: a slow start is forgotten.
    for i in range(11, 11 + STEADY_WINDOW):
        last = view.add(point(i, 1.0, 32, 2.0))
    assert last["samples_per_second"] == pytest.approx(16_000)


def test_loss_is_a_debiased_moving_average_that_never_hides_a_nan() -> None:
    view = ProgressView()
    assert view.add(point(1, 2.0, 8, 1.0))["loss"] == pytest.approx(2.0)  # not pulled to 0
    second = view.add(point(2, 1.0, 8, 1.0))["loss"]
    w = LOSS_SMOOTHING
    assert second == pytest.approx((w * (1 - w) * 2.0 + (1 - w) * 1.0) / (1 - w**2))
    assert math.isnan(view.add(point(3, math.nan, 8, 1.0))["loss"])
    assert view.add(point(4, 1.0, 8, 1.0))["loss"] < second  # the NaN did not poison it


def test_the_warm_up_never_counts_and_a_long_run_keeps_the_last_window() -> None:
    """The one definition (:func:`steady_rate`): a 50-step run is measured over its last 45
    steps, a long one over its last STEADY_WINDOW, whatever came before."""
    slow, fast = (1.0, 32_000.0), (100.0, 320.0)  # (samples/s, ms): 32 samples a step
    assert steady_rate([slow] * 5 + [fast] * 45, 50) == pytest.approx(100.0)
    assert steady_rate([slow] * 300 + [fast] * STEADY_WINDOW, 400) == pytest.approx(100.0)
    assert steady_rate([], 0) is None
    assert steady_window(STEADY_LOOKBACK) == STEADY_WINDOW > steady_window(STEADY_LOOKBACK - 1)
