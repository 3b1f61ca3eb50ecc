"""``GET /workers``: live workers, their devices, queues and current jobs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from amptrain.core import presence
from amptrain.server.event_view import worker_view
from amptrain.server.web.deps import CurrentUser, ServicesDep, SessionDep
from amptrain.server.web.errors import Unavailable, error_responses
from amptrain.store.job_reads import job_names, owned_job_ids

router = APIRouter(tags=["workers"], responses=error_responses(401, 503))


@router.get("/workers", summary="Live workers and their jobs")
def list_workers(services: ServicesDep, session: SessionDep, user: CurrentUser) -> dict[str, Any]:
    """Workers that heartbeated within their TTL, newest first.

    Each has ``name``, ``hostname``, ``queues`` (the queues it consumes: with
    ``devices_per_job`` K > 1 the shape queues ``gpu-xK``, ``cpu-xK``),
    ``concurrency``, ``devices_per_job``, ``slots`` (each pool process's ``slot``
    index and the ``gpus`` it owns, a list: empty on a CPU worker), ``devices``
    (the capability report), ``versions``, ``started_at``, ``last_heartbeat``
    (unix seconds), ``memory_available_bytes`` and ``memory_total_bytes`` (what a
    training process could get there, measured while it ran no job; the API checks
    submitted specs against it) and ``current_jobs`` (slot, job id and ``name``, attempt,
    ``gpu`` and ``gpus``, latest step, throughput, loss scale, memory; for a node of a multi-node
    job its ``node`` index and ``reservation``: ``waiting`` while the nodes are being
    reserved, ``training`` once they train). Of a job the caller may not see only
    ``slot``, ``gpu``, ``gpus`` and ``reservation`` are shown. Where workers run
    (``name``, ``hostname`` and the pids) is shown to admins only.
    """
    try:
        workers = presence.read_workers(services.redis)
    except Exception as exc:
        raise Unavailable({"redis": f"error: {type(exc).__name__}"}) from exc
    if not user.is_admin:
        _hide_foreign_jobs(session, user.name, workers)
        workers = [worker_view(w) for w in workers]
    _name_jobs(session, workers)
    return {"items": workers}


def _name_jobs(session: SessionDep, workers: list[dict[str, Any]]) -> None:
    """Each shown job's name beside its id: people know their jobs by name."""
    names = job_names(
        session, {j.get("job_id") for w in workers for j in w["current_jobs"]} - {None}
    )
    for w in workers:
        for j in w["current_jobs"]:
            if j.get("job_id") in names:
                j["name"] = names[j["job_id"]]


def _hide_foreign_jobs(session: SessionDep, owner: str, workers: list[dict[str, Any]]) -> None:
    ids = {j.get("job_id") for w in workers for j in w["current_jobs"]} - {None}
    if not ids:
        return
    mine = owned_job_ids(session, owner, ids)
    for w in workers:
        w["current_jobs"] = [
            j
            if j.get("job_id") in mine
            else {
                "slot": j.get("slot"),
                "gpu": j.get("gpu"),
                "gpus": j.get("gpus"),
                **({"reservation": j["reservation"]} if j.get("reservation") else {}),
            }
            for j in w["current_jobs"]
        ]
