"""Precision A/B comparisons: ``POST /comparisons`` trains one spec once per precision (and
once in tf32 too when the queue's workers are CUDA and fp32 was asked without it);
``GET /comparisons/{id}`` reports throughput, peak memory and final loss of each run, their
ratios against the fp32 run, the final evaluations and whether each arm kept fp32's
accuracy, and the loss curves aligned by step."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, cast

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from amptrain.contract.admission import WorkerMemory
from amptrain.contract.spec import JobSpec, Precision, Text
from amptrain.contract.text import PlainFloat
from amptrain.server.dispatcher import queue_for
from amptrain.server.web.admission import queue_workers
from amptrain.server.web.deps import CurrentUser, ServicesDep, SessionDep, charge_writes
from amptrain.server.web.errors import NotFound, ValidationFailed, clip, error_responses
from amptrain.server.web.routes.jobs import submit_job
from amptrain.server.web.schemas import PrecisionSegmentOut
from amptrain.store import comparisons as repo
from amptrain.store.accuracy import DEFAULT_TOLERANCE

router = APIRouter(prefix="/comparisons", tags=["comparisons"], responses=error_responses(401, 422))

MAX_RUNS = 4
"""The most precisions one comparison trains (tf32 added by the service included)."""


class ComparisonIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: JobSpec
    """The job every run trains; its ``precision`` is replaced by each of ``precisions``."""
    precisions: list[Precision] = Field(min_length=2, max_length=MAX_RUNS)
    """Distinct precisions, one job each, e.g. ``["fp32", "bf16", "fp16"]``; on GPU workers
    the service may add ``tf32`` (see ``POST /comparisons``)."""
    name: Text | None = Field(default=None, min_length=1, max_length=200)
    """Defaults to the spec's name. No control or bidi-formatting characters, as job names."""
    add_tf32: bool = True
    """On GPU workers, add a ``tf32`` run when ``fp32`` is asked without it (see
    ``POST /comparisons``); false: exactly the precisions listed."""


class Ratios(BaseModel):
    throughput: float | None
    """Steady-state samples/s over the baseline's (above 1: faster)."""
    peak_memory: float | None
    """Peak memory over the baseline's (below 1: smaller)."""
    final_loss: float | None
    """Final loss over the baseline's (near 1: as accurate)."""


class EvalDiff(BaseModel):
    accuracy_points: float | None
    """Final accuracy minus the baseline's, in percentage points (negative: worse)."""
    eval_loss_relative: float | None
    """Final eval loss over the baseline's, minus 1 (positive: worse)."""


class Verdict(BaseModel):
    kept_accuracy: bool | None
    """Every comparable eval metric within the tolerance; null until both this run and the
    baseline have succeeded and evaluated (or no metric is comparable)."""
    reasons: list[str]


class Tolerance(BaseModel):
    accuracy_points: float
    """The most accuracy an arm may lose, in percentage points."""
    eval_loss_relative: float
    """The most an arm's eval loss may exceed the baseline's, relative (0.02: 2%)."""


class ComparisonRun(BaseModel):
    precision: str
    job_id: str
    name: str
    status: str
    step: int
    max_steps: int
    effective_precision: str | None
    precision_history: list[PrecisionSegmentOut]
    """The run's precisions over its steps (more than one after a ``health.fallback``)."""
    error: dict[str, str] | None
    throughput: float | None
    """Mean samples/s after the first 10% of the steps."""
    peak_memory: int | None
    """Highest ``memory_peak`` recorded, bytes."""
    final_loss: float | None
    """Mean finite loss of the last 10% of the steps (1 to 100 steps)."""
    ratios: Ratios
    eval_step: int | None
    """The step of the run's final (newest) evaluation; null before the first."""
    eval: dict[str, float | None] | None
    """Its values by metric name (``accuracy``, ``eval_loss``, ...)."""
    eval_pending: bool
    """The run succeeded but the evaluation after its last step is not recorded yet (the
    verdict waits for it)."""
    eval_diff: EvalDiff
    verdict: Verdict


class LossCurves(BaseModel):
    step: list[int]
    """The shared step axis."""
    loss: dict[str, list[float | None]]
    """Per precision, the loss at each step of ``step`` (null: no point there)."""


class ComparisonOut(BaseModel):
    id: str
    name: str
    created_at: datetime
    spec: dict[str, Any]
    baseline: str | None
    """The precision the ratios are against (fp32), or null when no run trained in fp32."""
    tolerance: Tolerance
    """What the accuracy verdicts allow (``GET`` may set it)."""
    runs: list[ComparisonRun]
    loss_curves: LossCurves
    notice: str | None = None
    """Only in the answer to ``POST``: what the service changed in the request (a ``tf32``
    run it added); null otherwise."""


class ComparisonSummary(BaseModel):
    id: str
    name: str
    created_at: datetime
    runs: list[dict[str, str]]
    """``[{"precision", "job_id"}]``."""


class ComparisonList(BaseModel):
    items: list[ComparisonSummary]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ComparisonOut,
    responses=error_responses(400, 413, 429),
    summary="Start a precision comparison",
)
def create_comparison(
    body: ComparisonIn, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> ComparisonOut:
    """Submit ``spec`` once per precision (each an ordinary job of the caller's) and return
    the comparison's report. A bad spec is a 422 naming ``spec.<field>``.

    On GPUs strict fp32 is not what users get: PyTorch runs cuDNN convolutions in TF32 by
    default, and strict fp32 matmuls on a recent GPU are several times slower than TF32,
    so a speed-up against fp32 alone proves little. When every live worker of the spec's
    queue has a GPU, the spec does not ask for the CPU, ``fp32`` is among ``precisions``,
    ``tf32`` is not and there is room for one more run, a ``tf32`` run is added (last)
    and ``notice`` says so. It is an ordinary job like the others (it counts against the
    caller's write rate and active jobs); on a GPU below compute capability 8.0 it trains
    in IEEE fp32 and says why. Without live GPU workers (or when Redis does not answer),
    or with ``add_tf32`` false, the runs are the ones asked for."""
    if len(set(body.precisions)) != len(body.precisions):
        raise ValidationFailed.one("precisions", "list each precision once")
    precisions: list[str] = list(body.precisions)
    notice = None
    workers = queue_workers(services.redis, queue_for(body.spec)) if body.add_tf32 else None
    if _wants_tf32(body.spec, precisions, workers):
        precisions.append("tf32")
        notice = (
            f"added a tf32 run: the workers of queue {queue_for(body.spec)} have GPUs, where "
            "TF32 (PyTorch's default for convolutions) is the fair speed baseline; fp32 stays "
            "the baseline of the ratios and the accuracy verdict"
        )
    # One job per precision, each a write like a POST /jobs (the request itself paid one).
    charge_writes(services, user, len(precisions) - 1)
    runs = []
    for precision in precisions:
        spec = body.spec.model_copy(
            update={"precision": precision, "name": _run_name(body.spec.name, precision)}
        )
        try:
            job = submit_job(spec, session, user, services, Response())
        except ValidationFailed as exc:
            problems = cast(list[dict[str, Any]], exc.detail)
            raise ValidationFailed(
                [{**p, "field": f"spec.{p['field']}"} for p in problems]
            ) from None
        runs.append({"precision": precision, "job_id": job.id})
    row = repo.create(
        session,
        body.name or body.spec.name,
        user.name,
        body.spec.model_dump(mode="json"),
        runs,
    )
    report = ComparisonOut.model_validate(repo.report(session, row))
    return report.model_copy(update={"notice": notice})


def _wants_tf32(spec: JobSpec, precisions: list[str], workers: list[WorkerMemory] | None) -> bool:
    """Whether the service adds a tf32 run (see :func:`create_comparison`)."""
    if not workers or not all(w.gpu for w in workers):
        return False  # none live, a CPU among them, or unknown (Redis did not answer)
    return (
        spec.device != "cpu"
        and "fp32" in precisions
        and "tf32" not in precisions
        and len(precisions) < MAX_RUNS
    )


@router.get("", response_model=ComparisonList, summary="List comparisons")
def list_comparisons(
    session: SessionDep,
    user: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ComparisonList:
    """The caller's newest comparisons (an admin's: everyone's)."""
    rows = repo.newest(session, user.owner_filter, limit)
    return ComparisonList(
        items=[
            ComparisonSummary(id=r.id, name=r.name, created_at=r.created_at, runs=r.runs)
            for r in rows
        ]
    )


@router.get(
    "/{comparison_id}",
    response_model=ComparisonOut,
    responses=error_responses(404),
    summary="A comparison's report",
)
def read_comparison(
    comparison_id: str,
    session: SessionDep,
    user: CurrentUser,
    accuracy_points: Annotated[
        PlainFloat,
        Query(ge=0, le=100, description="The most accuracy an arm may lose, in points."),
    ] = DEFAULT_TOLERANCE["accuracy_points"],
    eval_loss_relative: Annotated[
        PlainFloat,
        Query(ge=0, le=10, description="The most an arm's eval loss may exceed fp32's (0.02: 2%)."),
    ] = DEFAULT_TOLERANCE["eval_loss_relative"],
) -> ComparisonOut:
    """Each run's status and numbers now, the ratios against the baseline, the final
    evaluations with the accuracy verdict per arm, and the curves."""
    row = repo.get(session, comparison_id)
    if row is None or not user.can_see(row):
        raise NotFound(f"no comparison {clip(comparison_id)}")
    tolerance = {"accuracy_points": accuracy_points, "eval_loss_relative": eval_loss_relative}
    return ComparisonOut.model_validate(repo.report(session, row, tolerance))


def _run_name(name: str, precision: str) -> str:
    suffix = f" [{precision}]"
    return name[: 200 - len(suffix)] + suffix
