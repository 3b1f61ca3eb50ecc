"""A job's history: metric points, evaluations and per-layer gradient norms (cursor = stream
entry id) and lifecycle events (cursor = id)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from amptrain.contract.cursor import INT64_MAX
from amptrain.contract.layers import LAYER_NORMS_READ_VALUES
from amptrain.contract.metrics import EXTREMA_FIELDS, LAYER_NORM_KIND
from amptrain.server.event_view import owner_view
from amptrain.server.web.deps import CurrentUser, SessionDep, parse_cursor, visible_job
from amptrain.server.web.errors import ValidationFailed, error_responses
from amptrain.server.web.params import (
    MAX_POINTS,
    CursorParams,
    FromStep,
    ToStep,
)
from amptrain.server.web.schemas import (
    BucketMark,
    EvalOut,
    EvalPage,
    EventOut,
    EventPage,
    LayerNormsOut,
    LayerNormsPage,
    MetricPage,
)
from amptrain.store.events import event_page
from amptrain.store.history.downsample import series_window
from amptrain.store.history.eval_window import eval_window
from amptrain.store.history.points import Page, metric_page
from amptrain.store.history.values import eval_page, newest_record_size
from amptrain.store.history.window import DEFAULT_EXTREMA, parse_fields, select_fields

router = APIRouter(prefix="/jobs", tags=["telemetry"], responses=error_responses(401, 404, 422))

METRICS_WINDOW = (
    "Return the whole run (or the ``from_step``..``to_step`` window) in at most this many "
    "points, marked ``downsampled``: per bucket of steps the first, the last, the min and max "
    f"of each requested field that can spike ({', '.join(EXTREMA_FIELDS)}; "
    f"{' and '.join(DEFAULT_EXTREMA)} by default) and the skipped or non-finite steps (all of "
    "them when they fit, else each bucket's first, counted in ``marks``). Each such point says "
    "whether it is its bucket's last (``bucket_last``): one per bucket, evenly spaced, what a "
    "smoothed line should read. Not with ``after``."
)
EVALS_WINDOW = (
    "Return the whole run (or the ``from_step``..``to_step`` window) in at most this many "
    "evaluations, marked ``downsampled``, by the rules of ``/metrics``: per bucket of steps "
    "the first and the last evaluation and, for each metric name, the evaluations holding "
    "its min and its max. The effective series, in step order. Not with ``after``."
)


# Unset fields stay out: ``marks`` belongs to max_points answers only.
@router.get(
    "/{job_id}/metrics",
    response_model=MetricPage,
    response_model_exclude_unset=True,
    summary="A job's metric points",
)
def read_metrics(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    query: CursorParams,
    max_points: Annotated[
        int | None, Query(ge=1, le=MAX_POINTS, description=METRICS_WINDOW)
    ] = None,
    from_step: FromStep = None,
    to_step: ToStep = None,
    fields: Annotated[
        str | None,
        Query(max_length=500, description="Comma-separated metric fields to return (default all)."),
    ] = None,
) -> MetricPage:
    """Recorded metric points after ``after`` in recording order; ``next_cursor`` passed back
    returns only newer points, so no point is ever repeated or skipped. With ``max_points``:
    the whole run downsampled in the database, ``next_cursor`` = the newest point's cursor."""
    visible_job(session, user, job_id)
    try:
        wanted = parse_fields(fields)
    except ValueError as exc:
        raise ValidationFailed.one("query.fields", str(exc)) from None
    if (budget := window_budget(max_points, query.after, from_step, to_step)) is not None:
        window = series_window(session, job_id, budget, wanted, from_step, to_step)
        marks = [BucketMark(**m) for m in window.marks]
        return MetricPage(items=window.items, next_cursor=window.next_cursor, marks=marks)
    cursor = parse_cursor(query.after, "query.after")
    items, next_cursor = metric_page(session, job_id, Page(cursor, query.limit, query.attempts))
    return MetricPage(items=[select_fields(i, wanted) for i in items], next_cursor=next_cursor)


def window_budget(
    max_points: int | None, after: str | None, from_step: int | None, to_step: int | None
) -> int | None:
    """``max_points`` when a request asks for a downsampled window, else None;
    ValidationFailed when its parameters do not go together."""
    if max_points is not None:
        if after is not None:
            raise ValidationFailed.one("query.after", "max_points covers the whole run: drop after")
        if from_step is not None and to_step is not None and to_step < from_step:
            raise ValidationFailed.one("query.to_step", "to_step must not be below from_step")
        return max_points
    if from_step is not None or to_step is not None:
        field = "query.from_step" if from_step is not None else "query.to_step"
        raise ValidationFailed.one(
            field, "a step window needs max_points (pages follow the cursor instead)"
        )
    return None


# Unset fields stay out: ``downsampled`` belongs to max_points answers only.
@router.get(
    "/{job_id}/evals",
    response_model=EvalPage,
    response_model_exclude_unset=True,
    summary="A job's evaluations",
)
def read_evals(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    query: CursorParams,
    max_points: Annotated[int | None, Query(ge=1, le=MAX_POINTS, description=EVALS_WINDOW)] = None,
    from_step: FromStep = None,
    to_step: ToStep = None,
) -> EvalPage:
    """Evaluations on the held-out split after ``after`` in recording order, by the same
    cursor as the metric points and events (``next_cursor`` passed back returns only newer
    ones, never repeating or skipping one). Each item is one evaluation with all its named
    values; a new metric name needs no new parameter. With ``max_points``: the whole run
    downsampled in the database, in step order, ``next_cursor`` = the newest evaluation's."""
    visible_job(session, user, job_id)
    if (budget := window_budget(max_points, query.after, from_step, to_step)) is not None:
        window = eval_window(session, job_id, budget, from_step, to_step)
        return EvalPage(items=[EvalOut(**i) for i in window.items], next_cursor=window.next_cursor)
    cursor = parse_cursor(query.after, "query.after")
    items, next_cursor = eval_page(session, job_id, Page(cursor, query.limit, query.attempts))
    return EvalPage(items=[EvalOut(**i) for i in items], next_cursor=next_cursor)


LAYER_NORMS_PAGE = 100
"""Steps a page of layer norms holds at most: each carries up to LAYER_NORMS_MAX values."""
LAYER_NORMS_WINDOW = (
    "Return the whole run (or the ``from_step``..``to_step`` window) in at most this many "
    "steps, marked ``downsampled``: per bucket of steps the first, the last and the step of "
    "the bucket's highest norm of any layer. The effective series, in step order. Not with "
    "``after``."
)


@router.get(
    "/{job_id}/layer-norms",
    response_model=LayerNormsPage,
    response_model_exclude_unset=True,
    summary="A job's per-layer gradient norms",
)
def read_layer_norms(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    query: CursorParams,
    max_points: Annotated[
        int | None, Query(ge=1, le=MAX_POINTS, description=LAYER_NORMS_WINDOW)
    ] = None,
    from_step: FromStep = None,
    to_step: ToStep = None,
) -> LayerNormsPage:
    """Per-layer gradient norms (``telemetry.layer_grad_norms_every``) after ``after`` in
    recording order, by the same cursor as the metric points, evaluations and events. Each
    item is one step with every layer's norm (up to 256 layers), so a page holds at most
    ``limit`` and at most 100 steps (follow ``next_cursor``). Empty for a job without the
    option. With ``max_points``: downsampled in the database, in step order,
    ``next_cursor`` = the newest item's; at most ``LAYER_NORMS_READ_VALUES`` (100,000)
    norms in all, so fewer steps than asked for a job with many layers (the answer's
    ``max_points`` and ``notice`` say so)."""
    visible_job(session, user, job_id)
    if (budget := window_budget(max_points, query.after, from_step, to_step)) is not None:
        layers = newest_record_size(session, job_id, LAYER_NORM_KIND)
        kept = min(budget, max(1, LAYER_NORMS_READ_VALUES // max(layers, 1)))
        window = eval_window(session, job_id, kept, from_step, to_step, LAYER_NORM_KIND)
        items = [LayerNormsOut(**i) for i in window.items]
        answer = LayerNormsPage(items=items, next_cursor=window.next_cursor, max_points=kept)
        if kept < budget:
            answer.notice = (
                f"max_points reduced from {budget} to {kept}: {layers} layers x max_points "
                f"may be at most {LAYER_NORMS_READ_VALUES} norms per read"
            )
        return answer
    cursor = parse_cursor(query.after, "query.after")
    page = Page(cursor, min(query.limit, LAYER_NORMS_PAGE), query.attempts)
    found, next_cursor = eval_page(session, job_id, page, LAYER_NORM_KIND)
    return LayerNormsPage(items=[LayerNormsOut(**i) for i in found], next_cursor=next_cursor)


@router.get("/{job_id}/events", response_model=EventPage, summary="A job's lifecycle events")
def read_events(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    after: Annotated[
        int, Query(ge=0, le=INT64_MAX, description="``next_cursor`` of the previous page.")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> EventPage:
    """Lifecycle events (queued, started, checkpoint, warning, resumed, succeeded, failed,
    cancelled) after ``after``, oldest first. Which worker and processes ran the job (host
    names, pids) is shown to admins only."""
    visible_job(session, user, job_id)
    found = event_page(session, job_id, after, limit)
    view = (lambda d: d) if user.is_admin else owner_view
    items = [EventOut(**{**e, "data": view(e.get("data") or {})}) for e in found]
    return EventPage(items=items, next_cursor=str(items[-1].id if items else after))
