"""Whole-run exports: ``GET /jobs/{id}/metrics/export`` and ``GET /comparisons/{id}/export``
stream every series of a run (of each run of a comparison) at full resolution as one
Parquet or CSV file, for pandas and polars users. The encoder
(:mod:`amptrain.server.history_export`, pyarrow) is imported by the first export, not when
the API starts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from amptrain.server.runtime import Services
from amptrain.server.web.deps import CurrentUser, ServicesDep, SessionDep, visible_job
from amptrain.server.web.errors import NotFound, clip, error_responses
from amptrain.store import comparisons

router = APIRouter(tags=["telemetry"], responses=error_responses(401, 404, 422))

ExportFormat = Literal["parquet", "csv"]
Format = Annotated[
    ExportFormat,
    Query(
        alias="format",
        description="``parquet`` (columns typed, names dictionary-encoded) or ``csv`` (a "
        "header line, then one line per row; NaN reads ``nan``).",
    ),
]
_FILES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The file, streamed as it is read.",
        "content": {"application/vnd.apache.parquet": {}, "text/csv": {}},
    }
}


@router.get(
    "/jobs/{job_id}/metrics/export",
    response_class=StreamingResponse,
    responses=_FILES,
    summary="Export a job's whole history (Parquet or CSV)",
)
def export_job(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    fmt: Format = "parquet",
) -> StreamingResponse:
    """Every series of the job's history at full resolution, streamed as one file in the
    long ("tidy") layout, a row per series and step. Columns: ``kind`` (dictionary-encoded
    string: ``step`` for a per-step field such as ``loss`` or ``lr``, ``eval`` for an
    evaluation metric, ``layer`` for a layer's gradient norm), ``series`` (dictionary-encoded
    string: the field, metric or layer name), ``step`` (int64) and ``value`` (float64; NaN
    where ``/metrics``, ``/evals`` or ``/layer-norms`` show null). The effective history
    (per step the newest attempt's value, as those reads return it), series after series,
    each in step order. ``pandas.read_parquet(f).pivot_table(index="step",
    columns="series", values="value")`` gives one column per series. A running job's
    export ends at what was recorded when it was read. An interrupted download is not a
    valid Parquet file (its footer is last); a CSV one ends mid-way."""
    visible_job(session, user, job_id)
    return _stream(services, [job_id], fmt, with_job=False, name=job_id)


@router.get(
    "/comparisons/{comparison_id}/export",
    response_class=StreamingResponse,
    responses=_FILES,
    summary="Export every run of a comparison (Parquet or CSV)",
)
def export_comparison(
    comparison_id: str,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    fmt: Format = "parquet",
) -> StreamingResponse:
    """Every run of the comparison exported as ``GET /jobs/{id}/metrics/export`` does, one
    run after the other in the comparison's order, with a first column ``job`` (the run's
    job id, dictionary-encoded; ``GET /comparisons/{id}`` says each one's precision)."""
    row = comparisons.get(session, comparison_id)
    if row is None or not user.can_see(row):
        raise NotFound(f"no comparison {clip(comparison_id)}")
    job_ids = [run["job_id"] for run in row.runs]
    return _stream(services, job_ids, fmt, with_job=True, name=row.id)


def _stream(
    services: Services, job_ids: list[str], fmt: ExportFormat, with_job: bool, name: str
) -> StreamingResponse:
    from amptrain.server.history_export import MEDIA_TYPES, export_stream

    body = export_stream(services.session_factory, job_ids, fmt, with_job)
    # ``name`` is the id of a row just found, never the caller's text.
    disposition = f'attachment; filename="{name}.{fmt}"'
    return StreamingResponse(
        body, media_type=MEDIA_TYPES[fmt], headers={"Content-Disposition": disposition}
    )
