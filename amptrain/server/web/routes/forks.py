"""``POST /jobs/{id}/fork``: a new job whose first state is the parent's checkpoint at a step.

The fork's spec comes from :func:`amptrain.contract.forks.fork_spec` and then passes what a
submit passes (components, the service's limits, size, queue, the caller's active jobs).
Its checkpoint is pinned (:mod:`amptrain.core.checkpoint_pins`) before it is checked for:
a prune by the parent's still-running training after the pin keeps it, and one before the
check is seen by the check.
"""

from __future__ import annotations

from fastapi import APIRouter, status

from amptrain.contract.forks import ForkRefused, ForkRequest, fork_spec
from amptrain.core.checkpoint_pins import CheckpointPins
from amptrain.server.web.admission import submission_problems
from amptrain.server.web.deps import (
    CurrentUser,
    ServicesDep,
    SessionDep,
    visible_job,
)
from amptrain.server.web.errors import Conflict, ValidationFailed, error_responses, field_problems
from amptrain.server.web.routes.alerts import create_rules
from amptrain.server.web.routes.jobs import (
    canonical_spec,
    check_active_jobs,
    dispatch_on_commit,
    request_hash,
)
from amptrain.server.web.schemas import JobOut
from amptrain.store import jobs as repo

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=error_responses(401, 404, 422))

FORKABLE_LISTED = 100
"""Forkable steps a refusal lists (the newest ones): ``keep_last`` is at most 100."""


@router.post(
    "/{job_id}/fork",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses=error_responses(400, 409, 413, 429),
    summary="Fork a job from one of its checkpoints",
)
def fork_job(
    job_id: str,
    body: ForkRequest,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> JobOut:
    """Queue a fork of the job: its spec with ``overrides`` applied (the optimizer and
    schedule, precision, ``max_steps`` above ``step``, evaluation, health, telemetry,
    checkpoint cadence and a few more; never the model, the dataset or the batch: a 422
    naming ``overrides.<field>``), starting from the job's checkpoint at ``step``. The fork
    trains steps ``step + 1`` to its ``max_steps``; its ``forked_from`` names the parent. A
    step without a checkpoint is a 409 listing the forkable steps."""
    parent = visible_job(session, user, job_id)
    try:
        spec = fork_spec(parent.spec, body)
    except ForkRefused as exc:
        raise ValidationFailed(field_problems(exc.problems)) from None
    problems, queue, workers = submission_problems(
        spec, user.name, services, len(canonical_spec(spec))
    )
    if problems:
        where = [{**p, "loc": ("overrides", *p.get("loc", ()))} for p in problems]
        raise ValidationFailed(field_problems(where))
    if not user.is_admin:
        check_active_jobs(session, user.name, services.settings.max_active_jobs_per_user)
    child = repo.create_job(
        session,
        spec,
        user.name,
        queue,
        request_hash=request_hash(spec),
        fork_of=(parent.id, body.step),
    )
    # A fork keeps its parent's ``alerts``: rules of its own, scoped to it.
    create_rules(session, user.name, spec.alerts, services.settings, job_id=child.id)
    pins = CheckpointPins(services.settings.checkpoint_url, parent.id)
    pins.pin(body.step, child.id)
    steps = pins.steps()
    if body.step not in steps:
        pins.release(body.step, child.id)  # the raise rolls the child back
        raise Conflict(_not_forkable(parent.id, body.step, steps))
    return dispatch_on_commit(session, child, user, services, workers)


def _not_forkable(job_id: str, step: int, steps: list[int]) -> dict[str, object]:
    if not steps:
        message = f"job {job_id} has no checkpoints (none written yet, or all removed)"
    else:
        message = f"job {job_id} has no checkpoint at step {step}; fork one of its checkpoints"
    return {"message": message, "forkable_steps": steps[-FORKABLE_LISTED:]}
