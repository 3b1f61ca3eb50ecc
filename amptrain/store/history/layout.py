"""What a metric summary node holds (:mod:`amptrain.store.history.summaries`): its levels, the fields
whose extremes it keeps and its columns, shared by the code that keeps, rebuilds and
reads the summaries."""

from __future__ import annotations

BASE = 4
"""The finest level: nodes of 16 steps. A read covers at most 15 steps at each end of a
window from the raw points; a finer base would make writes dearer."""
MAX_LEVEL = 31
"""Steps are 32-bit."""
SUMMARY_FIELDS = (
    "loss",
    "grad_norm",
    "loss_scale",
    "samples_per_second",
    "step_time_ms",
    "memory_allocated",
)
"""= amptrain.store.history.window.EXTREMA_FIELDS."""
COUNTS = ("points", "first_step", "last_step", "skipped", "non_finite", "flagged", "first_flag")
EXTREMA_COLUMNS = tuple(
    f"{f}_{kind}{suffix}"
    for f in SUMMARY_FIELDS
    for kind in ("min", "max")
    for suffix in ("", "_step")
)
COLUMNS = (*COUNTS, *EXTREMA_COLUMNS)
DBL_MAX = 1.7976931348623157e308
"""The largest finite double: ``BETWEEN -DBL_MAX AND DBL_MAX`` is "finite" in SQL on both
databases (false for NULL, NaN and the infinities)."""
