"""Response models: the JSON shapes clients and the dashboard depend on."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, create_model

from amptrain.contract.metrics import BY_NAME, SUMMARY_FIELDS, python_type
from amptrain.contract.progress import LAST_LOSS_DOC, STEADY_RATE_DOC
from amptrain.store.models import Job


class PrecisionOut(BaseModel):
    requested: str | None = None
    """What the spec asked for (``auto``, ``fp32``, ``fp16``, ``bf16``)."""
    effective: str | None = None
    """What the worker runs; null until an attempt started."""
    reason: str | None = None
    """Why ``auto`` (or a fallback) chose ``effective``."""


class PrecisionFallbackOut(BaseModel):
    """The ``precision_fallback`` event that began a precision entry, as its fields (the
    precision it left is the previous entry's)."""

    trigger: str | None = None
    """``loss_scale_floor``, ``consecutive_skips`` or ``nonfinite_loss``."""
    trigger_step: int | None = None
    """The step at which the precision it left became unhealthy."""
    to: str | None = None
    """The precision it went on in."""
    resume_from: int | None = None
    """The step of the healthy checkpoint it resumed from; 0: the start (there was none)."""
    param: str | None = None
    """The first parameter whose gradient was not finite, when known."""


class PrecisionSegmentOut(BaseModel):
    """From ``from_step`` on (until the next entry), the job trained in ``precision``."""

    from_step: int
    until_step: int | None = None
    """The step a fallback left this precision at (its steps after that were trained
    again in the next one); null: it trained until the next entry began, or to the end."""
    precision: str | None
    attempt: int
    """The attempt that began it."""
    reason: str | None
    """Why: the precision policy's reason, or the ``precision_fallback`` that led here."""
    fallback: PrecisionFallbackOut | None = None
    """The fallback that led here, as its fields; null for the first entry."""


class ErrorOut(BaseModel):
    code: str
    message: str
    step: int | None = None
    """The step it happened at (the last step of the job's history); null when none."""


_SUMMARY: dict[str, Any] = {
    name: (python_type(BY_NAME[name]) | None, Field(None, description=BY_NAME[name].doc))
    for name in SUMMARY_FIELDS
}
_SUMMARY["samples_per_second"] = (float | None, Field(None, description=STEADY_RATE_DOC))
_SUMMARY["loss"] = (float | None, Field(None, description=LAST_LOSS_DOC))


class EvalSummaryOut(BaseModel):
    """The job's newest evaluation: the newest attempt that evaluated, at its highest step
    (when the job has finished, its final held-out metrics)."""

    step: int
    attempt: int
    values: dict[str, float | None]
    """Metric name (``GET /catalog``'s ``eval_metrics``, or a plugin's) -> value; null when
    it was not finite."""


_SUMMARY["eval"] = (
    EvalSummaryOut | None,
    Field(None, description="The newest evaluation; null before the first."),
)
_SUMMARY["overflow_counts"] = (
    dict[str, int],
    Field(
        default_factory=dict,
        description=(
            "fp16: per parameter (module path), the skipped steps whose first non-finite "
            "gradient in backward order was its, most first; empty when none overflowed."
        ),
    ),
)
SummaryOut = create_model(
    "SummaryOut",
    __doc__="Latest values, from the newest recorded metric point and evaluation.",
    **_SUMMARY,
)
"""The metric table's ``summary`` fields (:data:`amptrain.contract.metrics.SUMMARY_FIELDS`)."""


class ForkedFrom(BaseModel):
    """A fork's origin: the parent job and the step of its checkpoint the fork started from
    (the fork's own steps begin after it)."""

    job: str
    step: int


class ForkOut(BaseModel):
    id: str
    name: str
    status: str
    step: int
    """The fork's latest step."""
    fork_step: int
    """The parent's checkpoint it started from."""


class ForksOut(BaseModel):
    items: list[ForkOut]
    """The newest forks the caller may see, at most :data:`FORKS_SHOWN`."""
    more: bool
    """More forks exist than are listed."""


FORKS_SHOWN = 20


class NodeRankOut(BaseModel):
    rank: int
    """Its rank in the whole world (rank 0 publishes the series and writes checkpoints)."""
    pid: int | None = None
    """Admins only: the process id on its machine."""


class NodeOut(BaseModel):
    """One machine of a ``nodes`` > 1 attempt."""

    node: int
    """0: the first node, which hosts the rendezvous and records the job's state."""
    worker: str | None = None
    """Admins only: the worker (its name says where the job runs)."""
    address: str | None = None
    """Admins only: the node's address on the network its ranks talk over."""
    ranks: list[NodeRankOut]


class JobOut(BaseModel):
    id: str
    name: str
    owner: str
    """The name of the token that submitted it."""
    status: str
    spec: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    step: int
    max_steps: int
    attempt: int
    worker: str | None
    """The worker running the current attempt (null when not running, and for all but
    admins: its name, ``amptrain-PID@HOST``, says where the job runs)."""
    precision: PrecisionOut
    error: ErrorOut | None
    summary: SummaryOut  # type: ignore[valid-type]
    precision_history: list[PrecisionSegmentOut] | None = None
    """Only in ``GET /jobs/{id}``: each precision the job trained in and from which step
    (more than one entry after a ``health.fallback``); null elsewhere."""
    forked_from: ForkedFrom | None = None
    """A fork's parent and step (``POST /jobs/{id}/fork``); null for a job that started afresh."""
    forks: ForksOut | None = None
    """Only in ``GET /jobs/{id}``: the job's forks, newest first; null elsewhere."""
    nodes: list[NodeOut] | None = None
    """Only in ``GET /jobs/{id}`` of a job that started on several machines (``nodes`` >
    1): the newest such attempt's nodes and their ranks; null otherwise."""
    nodes_attempt: int | None = None
    """The attempt ``nodes`` describes."""
    notice: str | None = None
    """Only in the answer to a submit: why the job may wait (no live worker takes jobs of
    its queue now); null otherwise."""

    @classmethod
    def from_job(cls, job: Job, *, admin: bool) -> JobOut:
        """The job as ``admin`` (or its owner, who does not see the worker) reads it."""
        summary = job.summary or {}
        return cls(
            id=job.id,
            name=job.name,
            owner=job.owner,
            status=job.status,
            spec=job.spec,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            step=job.step or 0,
            max_steps=job.max_steps,
            attempt=job.attempt,
            worker=job.worker if admin else None,
            precision=PrecisionOut(
                requested=job.precision_requested or job.spec.get("precision"),
                effective=job.precision_effective,
                reason=job.precision_reason,
            ),
            error=(
                ErrorOut(code=job.error_code, message=job.error_message or "", step=job.error_step)
                if job.error_code
                else None
            ),
            summary=SummaryOut(
                **{k: summary.get(k) for k in SUMMARY_FIELDS},
                eval=job.eval_summary,
                overflow_counts=job.overflow_counts or {},
            ),
            forked_from=(
                ForkedFrom(job=job.parent_id, step=job.fork_step)
                if job.parent_id is not None and job.fork_step is not None
                else None
            ),
        )


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(
        description="Pass as ``cursor`` for the next (older) page; null at the end."
    )


class BucketMark(BaseModel):
    """A bucket of a downsampled answer that holds skipped or non-finite steps."""

    from_step: int
    to_step: int
    flagged: int
    """Steps in the bucket that were skipped or had a non-finite loss or grad norm."""
    skipped: int
    non_finite: int
    """Steps whose loss was NaN or infinite (shown as null)."""


class MetricPage(BaseModel):
    items: list[dict[str, Any]]
    """Telemetry records (``amptrain.contract.metrics.STORED_METRIC_FIELDS``: ``world_size``
    and ``memory_peak_per_rank`` null for one device) plus ``attempt`` and ``cursor``."""
    next_cursor: str | None
    """Pass as ``after`` to get only newer points."""
    marks: list[BucketMark] = Field(default_factory=list)
    """Only with ``max_points``: the buckets holding skipped or non-finite steps and how
    many (each bucket's first such step is always among ``items``; all are when they fit)."""


class EvalOut(BaseModel):
    """One evaluation on the held-out split, as its eval record arrived."""

    step: int
    """The optimizer step the evaluated model is at."""
    attempt: int
    time: float
    """Unix seconds."""
    cursor: str
    values: dict[str, float | None]
    """Metric name -> value (null when not finite). ``effective``: only the names no newer
    attempt re-evaluated at this step."""
    downsampled: bool | None = None
    """Only with ``max_points``: false when the window holds every evaluation."""


class EvalPage(BaseModel):
    items: list[EvalOut]
    next_cursor: str | None
    """Pass as ``after`` to get only newer evaluations."""


class LayerNormsOut(BaseModel):
    """One step's per-layer gradient norms (``telemetry.layer_grad_norms_every``)."""

    step: int
    attempt: int
    time: float
    """Unix seconds."""
    cursor: str
    values: dict[str, float | None]
    """Layer (module path, ``blocks.3.attn``) -> the norm of its parameters' gradients
    after unscaling, before clipping (null when not finite: an overflowing fp16 step)."""
    downsampled: bool | None = None
    """Only with ``max_points``: false when the window holds every due step."""


class LayerNormsPage(BaseModel):
    items: list[LayerNormsOut]
    next_cursor: str | None
    """Pass as ``after`` to get only newer steps' norms."""
    max_points: int | None = None
    """Only with ``max_points``: the steps this read kept at most, fewer than asked when
    the job's layers x ``max_points`` would pass ``LAYER_NORMS_READ_VALUES`` (``notice``
    says so)."""
    notice: str | None = None
    """Only when ``max_points`` was reduced: by how much and why."""


class EventOut(BaseModel):
    id: int
    """The events cursor."""
    attempt: int
    type: str
    step: int | None
    time: float
    """Unix seconds."""
    data: dict[str, Any]


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None
    """Pass as ``after`` to get only newer events."""
