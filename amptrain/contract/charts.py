"""The charts of a job's page: how the metric table's series are shown (each
:class:`~amptrain.contract.metrics.Metric` names its chart by ``key``). ``GET /catalog``
serves them beside the metrics, so the dashboard draws what this table says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Chart:
    """One chart of a job's page: the metrics whose ``chart`` is its ``key`` share it."""

    key: str
    title: str
    log: Literal["toggle", "log2"] | None = None
    """``toggle``: a log-axis checkbox; ``log2``: always a base-2 log axis."""
    smooth: bool = False
    """Offer EMA smoothing (drawn over the raw line)."""
    marks: bool = False
    """Mark skipped and non-finite steps."""
    empty: str | None = None
    """Shown instead of the chart when the job has none of its values, after the job's
    precision (``fp32 needs no loss scaling: ...``)."""


CHARTS: tuple[Chart, ...] = (
    Chart("loss", "Loss", log="toggle", smooth=True, marks=True),
    Chart(
        "loss_scale",
        "Loss scale",
        log="log2",
        marks=True,
        empty="needs no loss scaling: only fp16 scales the loss.",
    ),
    Chart("grad_norm", "Grad norm", log="toggle", smooth=True, marks=True),
    Chart("lr", "Learning rate", log="toggle"),
    Chart("memory", "Memory"),
    Chart("throughput", "Samples/s", smooth=True),
)
