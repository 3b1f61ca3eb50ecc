"""Jobs: submit (idempotent), read, list (keyset-paged, newest first), cancel."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response, status
from sqlalchemy.exc import IntegrityError

from amptrain.contract.admission import WorkerMemory
from amptrain.contract.job_ids import JOB_ID_PREFIX
from amptrain.contract.spec import JobSpec
from amptrain.core.checkpoint_pins import CheckpointPins
from amptrain.core.enums import JobStatus
from amptrain.core.redis import CANCEL_KEY_TTL_S, Keys
from amptrain.server.runtime import Services
from amptrain.server.web.admission import no_worker_notice, submission_problems
from amptrain.server.web.auth import Principal
from amptrain.server.web.deps import (
    CurrentUser,
    ServicesDep,
    SessionDep,
    after_commit,
    release_connection,
    visible_job,
)
from amptrain.server.web.errors import (
    Conflict,
    NotFound,
    TooMany,
    ValidationFailed,
    clip,
    error_responses,
    field_problems,
)
from amptrain.server.web.routes.alerts import create_rules
from amptrain.server.web.schemas import (
    FORKS_SHOWN,
    ForkOut,
    ForksOut,
    JobOut,
    JobPage,
    NodeOut,
    NodeRankOut,
    PrecisionSegmentOut,
)
from amptrain.store import job_reads, quotas
from amptrain.store import jobs as repo
from amptrain.store.models import Job

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=error_responses(401, 422))

_STATUSES = [s.value for s in JobStatus]
STATUS_LIST = rf"^({'|'.join(_STATUSES)})(,({'|'.join(_STATUSES)}))*$"
"""What ``GET /jobs?status=`` takes, as the schema documents it (spaces around commas are
tolerated too)."""


def canonical_spec(spec: JobSpec) -> bytes:
    """The spec (after defaults) as compact, key-sorted JSON: what is stored and hashed."""
    dumped = spec.model_dump(mode="json")
    return json.dumps(dumped, sort_keys=True, separators=(",", ":")).encode()


def request_hash(spec: JobSpec) -> str:
    """Fingerprint of the submitted spec (after defaults), for Idempotency-Key replays."""
    return hashlib.sha256(canonical_spec(spec)).hexdigest()


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses=error_responses(400, 409, 413, 429),
    summary="Submit a job",
)
def submit_job(
    spec: JobSpec,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    response: Response,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)
    ] = None,
) -> JobOut:
    """Queue a training job. With an ``Idempotency-Key`` the same key and body return the
    original job (200); the same key with another body is a 409. A caller already holding
    ``AMPTRAIN_MAX_ACTIVE_JOBS_PER_USER`` unfinished jobs gets 429 (admins are exempt)."""
    problems, queue, workers = submission_problems(
        spec, user.name, services, len(canonical_spec(spec))
    )
    if problems:
        raise ValidationFailed(field_problems(problems))
    digest = request_hash(spec)
    if idempotency_key:
        existing = repo.find_by_idempotency_key(session, user.name, idempotency_key)
        if existing is not None:
            return _replay(existing, digest, response, user.is_admin)
    if not user.is_admin:
        check_active_jobs(session, user.name, services.settings.max_active_jobs_per_user)
    try:
        job = repo.create_job(session, spec, user.name, queue, idempotency_key, digest)
    except IntegrityError:
        # A concurrent request with the same key won the insert.
        session.rollback()
        existing = (
            repo.find_by_idempotency_key(session, user.name, idempotency_key)
            if idempotency_key
            else None
        )
        if existing is None:
            raise
        return _replay(existing, digest, response, user.is_admin)
    create_rules(session, user.name, spec.alerts, services.settings, job_id=job.id)
    return dispatch_on_commit(session, job, user, services, workers)


def dispatch_on_commit(
    session: SessionDep,
    job: Job,
    user: Principal,
    services: Services,
    workers: Sequence[WorkerMemory] | None,
) -> JobOut:
    """Hand the new ``job`` to its queue once the request commits (never on rollback), and
    answer with it, noting when no live worker (of ``workers``) takes its queue."""
    job_id, queue_name, dispatcher = job.id, job.queue, services.dispatcher
    after_commit(session, lambda: dispatcher.submit(job_id, queue_name))
    return JobOut.from_job(job, admin=user.is_admin).model_copy(
        update={"notice": no_worker_notice(job.queue, workers)}
    )


def check_active_jobs(session: SessionDep, owner: str, limit: int) -> None:
    quotas.lock_owner(session, owner)
    in_use = quotas.active_jobs(session, owner)
    if in_use >= limit:
        raise TooMany(
            {
                "message": f"{in_use} of your jobs are queued or running; at most {limit} "
                "may be: wait for one to finish or cancel one",
                "limit": limit,
                "in_use": in_use,
            }
        )


def _replay(job: Job, digest: str, response: Response, admin: bool) -> JobOut:
    if job.request_hash != digest:
        raise Conflict("Idempotency-Key was already used with a different request body")
    response.status_code = status.HTTP_200_OK
    return JobOut.from_job(job, admin=admin)


@router.get("", response_model=JobPage, summary="List jobs")
def list_jobs(
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    status_filter: Annotated[
        str | None,
        Query(
            alias="status",
            max_length=200,
            description=f"One status or a comma-separated list of: {', '.join(_STATUSES)}.",
            json_schema_extra={"pattern": STATUS_LIST},
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None,
        Query(max_length=200, description="``next_cursor`` of the previous page."),
    ] = None,
    id_prefix: Annotated[
        str | None,
        Query(
            pattern=f"^{JOB_ID_PREFIX.pattern}$",
            description="Only jobs whose id starts with this (how the CLI resolves a "
            "shortened id: one match, or several to choose from).",
        ),
    ] = None,
) -> JobPage:
    """Jobs the caller may see, newest first, paged by an opaque keyset cursor. A page
    holds up to ``limit`` jobs, fewer when their specs would exceed
    ``AMPTRAIN_MAX_PAGE_BYTES`` (follow ``next_cursor``)."""
    statuses = None
    if status_filter is not None:  # exactly the documented pattern: `status=` is no status
        statuses = status_filter.split(",")
        known = _STATUSES
        bad = [s for s in statuses if s not in known]
        if bad:
            raise ValidationFailed(
                [
                    {
                        "field": "query.status",
                        "message": f"unknown status {b!r}; expected one of {', '.join(known)}",
                        "type": "enum",
                    }
                    for b in bad
                ]
            )
    items, more = job_reads.page_of_jobs(
        session,
        owner=user.owner_filter,
        statuses=statuses,
        after=decode_cursor(cursor) if cursor else None,
        limit=limit,
        id_prefix=id_prefix,
    )
    release_connection(session)  # before FastAPI's response-validation hop
    kept = _within_budget(items, services.settings.max_page_bytes)
    more = more or len(kept) < len(items)
    next_cursor = encode_cursor(kept[-1]) if more and kept else None
    return JobPage(
        items=[JobOut.from_job(j, admin=user.is_admin) for j in kept], next_cursor=next_cursor
    )


def _within_budget(items: list[Job], budget: int) -> list[Job]:
    """The leading jobs whose specs fit in ``budget`` bytes (always at least one, so
    paging moves on)."""
    used = 0
    for i, job in enumerate(items):
        used += len(json.dumps(job.spec, separators=(",", ":")))
        if used > budget and i > 0:
            return items[:i]
    return items


def encode_cursor(job: Job) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, _, job_id = raw.partition("|")
        parsed = datetime.fromisoformat(stamp)
        if not job_id or len(job_id) > 40 or parsed.tzinfo is None:
            raise ValueError(raw)
        # An offset that moves the instant outside years 1..9999 overflows here, not in SQL.
        created_at = parsed.astimezone(UTC)
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed.one("query.cursor", "invalid cursor") from None
    return created_at, job_id


@router.get("/{job_id}", response_model=JobOut, responses=error_responses(404), summary="Get a job")
def read_job(job_id: str, session: SessionDep, user: CurrentUser) -> JobOut:
    """One job: status, progress, precision (and its history), error and latest metrics
    summary."""
    job = visible_job(session, user, job_id)
    history = [PrecisionSegmentOut(**h) for h in job_reads.precision_history(session, job_id)]
    forks, more = job_reads.forks_of(session, job_id, user.owner_filter, FORKS_SHOWN)
    listed = ForksOut(
        items=[
            ForkOut(id=f.id, name=f.name, status=f.status, step=f.step, fork_step=f.fork_step or 0)
            for f in forks
        ],
        more=more,
    )
    placed = job_reads.nodes(session, job_id)
    release_connection(session)  # before FastAPI's response-validation hop
    update: dict[str, Any] = {"precision_history": history, "forks": listed}
    if placed is not None:
        update |= {"nodes_attempt": placed[0], "nodes": _nodes(placed[1], user.is_admin)}
    return JobOut.from_job(job, admin=user.is_admin).model_copy(update=update)


def _nodes(found: list[dict[str, Any]], admin: bool) -> list[NodeOut]:
    """The nodes as ``admin`` (or the job's owner, who sees no worker, address or pid) reads
    them; malformed entries (an event is data a worker wrote) are left out."""
    out = []
    for node in found:
        try:
            ranks = [
                NodeRankOut(rank=int(r["rank"]), pid=int(r["pid"]) if admin else None)
                for r in node.get("ranks") or []
            ]
            out.append(
                NodeOut(
                    node=int(node["node"]),
                    worker=str(node["worker"]) if admin else None,
                    address=str(node["address"]) if admin else None,
                    ranks=ranks,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=error_responses(404, 409, 429),
    summary="Cancel a job",
)
def cancel_job(
    job_id: str, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> JobOut:
    """Stop a job: a queued one ends ``cancelled`` at once, a running one turns ``cancelling``
    and its worker stops at the next step boundary. A finished job is a 409."""
    job = visible_job(session, user, job_id)
    try:
        new_status = repo.request_cancel(session, job_id)
    except repo.JobFinished as exc:
        raise Conflict(f"job {job_id} already {exc.status}") from None
    except repo.JobNotFound:
        raise NotFound(f"no job {clip(job_id)}") from None
    if new_status == JobStatus.CANCELLING:
        client = services.redis
        after_commit(session, lambda: client.set(Keys.cancel(job_id), "1", ex=CANCEL_KEY_TTL_S))
    elif job.parent_id is not None and job.fork_step is not None:
        # A fork cancelled while queued never takes its own copy of the parent's checkpoint.
        pins = CheckpointPins(services.settings.checkpoint_url, job.parent_id)
        step = job.fork_step
        after_commit(session, lambda: pins.release(step, job_id))
    session.expire_all()
    return JobOut.from_job(visible_job(session, user, job_id), admin=user.is_admin)
