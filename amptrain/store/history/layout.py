"""What a metric summary node holds (:mod:`amptrain.store.history.summaries`): its levels and
its columns (counts, and the extremes of every field the metric table marks ``extremes``),
shared by the code that keeps, rebuilds and reads the summaries."""

from __future__ import annotations

from amptrain.contract.metrics import EXTREMA_FIELDS

BASE = 4
"""The finest level: nodes of 16 steps. A read covers at most 15 steps at each end of a
window from the raw points; a finer base would make writes dearer."""
MAX_LEVEL = 31
"""Steps are 32-bit."""
COUNTS = ("points", "first_step", "last_step", "skipped", "non_finite", "flagged", "first_flag")


def extrema(field: str) -> tuple[str, ...]:
    """A field's summary columns: its lowest and highest finite value, each with the first
    step holding it (``loss_min``, ``loss_min_step``, ``loss_max``, ``loss_max_step``)."""
    return tuple(f"{field}_{kind}{suffix}" for kind in ("min", "max") for suffix in ("", "_step"))


EXTREMA_COLUMNS = tuple(c for f in EXTREMA_FIELDS for c in extrema(f))
COLUMNS = (*COUNTS, *EXTREMA_COLUMNS)
DBL_MAX = 1.7976931348623157e308
"""The largest finite double: ``BETWEEN -DBL_MAX AND DBL_MAX`` is "finite" in SQL on both
databases (false for NULL, NaN and the infinities)."""
