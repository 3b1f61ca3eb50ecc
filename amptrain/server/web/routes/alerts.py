"""Alert rules: ``POST/GET/DELETE /alerts/rules`` and each rule's webhook deliveries.

A rule is its owner's: it only ever watches and fires on its owner's jobs, and only its
owner (or an admin) sees it; another user gets a 404, never a 403. Its signing secret is
shown once, in the answer that created it (or rotated it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response, status
from pydantic import BaseModel, ConfigDict
from sqlalchemy.orm import Session

from amptrain.contract.alerts import ALERT_EVENTS, JobAlert, RuleSpec
from amptrain.core.settings import Settings
from amptrain.server.web.auth import Principal
from amptrain.server.web.deps import CurrentUser, ServicesDep, SessionDep, release_connection
from amptrain.server.web.errors import (
    NotFound,
    TooMany,
    ValidationFailed,
    clip,
    error_responses,
    field_problems,
)
from amptrain.server.webhooks import url_problems
from amptrain.store import alert_rules as repo
from amptrain.store import deliveries
from amptrain.store.jobs import get_job
from amptrain.store.models import AlertRule

router = APIRouter(prefix="/alerts", tags=["alerts"], responses=error_responses(401, 422))


class RuleOut(BaseModel):
    id: int
    name: str
    owner: str
    kind: str
    """What the rule watches: ``event``, ``threshold``, ``deviation``, ``no_progress`` or
    ``early_stop``."""
    job_id: str | None
    """The one job it watches (its spec's ``alerts``, or ``scope.job_id``); null: many."""
    spec: dict[str, Any]
    """The rule as created (``when``, ``scope``, ``notify``, ``stop``)."""
    created_at: datetime

    # Read from the row's attributes by pydantic (never its secret: RuleOut has no field
    # for it; only RuleCreated adds it, once).
    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, rule: AlertRule) -> RuleOut:
        return cls.model_validate(rule)


class RuleCreated(RuleOut):
    secret: str
    """Signs every webhook of this rule (``X-Amptrain-Signature``): shown only now."""


class RulePage(BaseModel):
    items: list[RuleOut]
    next_after: int | None
    """Pass as ``after`` for the next page; null: no more."""


class DeliveryOut(BaseModel):
    id: int
    firing_id: int
    """Also the receiver's idempotency id, ``amptrain-firing-{firing_id}``."""
    job_id: str
    attempt: int
    step: int | None
    key: str
    url: str
    status: str
    """``pending`` (waiting or retrying), ``delivered`` or ``failed`` (given up)."""
    attempts: int
    max_retries: int
    history: list[dict[str, Any]]
    """One ``{"at", "status_code", "error"}`` per attempt, oldest first."""
    created_at: datetime


class DeliveryPage(BaseModel):
    items: list[DeliveryOut]
    next_before: int | None


def create_rules(
    session: Session,
    owner: str,
    rules: Sequence[JobAlert | RuleSpec],
    settings: Settings,
    job_id: str | None = None,
) -> list[AlertRule]:
    """Store rules of ``owner`` (a 429 beyond the per-user count)."""
    created = []
    for rule in rules:
        try:
            created.append(
                repo.create_rule(session, owner, rule, settings.max_alert_rules_per_user, job_id)
            )
        except repo.TooManyRules as exc:
            limit = settings.max_alert_rules_per_user
            raise TooMany({"message": str(exc), "limit": limit}) from None
    return created


@router.post(
    "/rules",
    status_code=status.HTTP_201_CREATED,
    response_model=RuleCreated,
    responses=error_responses(400, 413, 429),
    summary="Create an alert rule",
)
def create_rule(
    spec: RuleSpec, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> RuleCreated:
    """Add an alert rule over your jobs: it matches an event (``when.kind: event``, one of
    the names in ``when.events``), a series crossing a threshold or deviating from its
    recent window, no recorded step for a while, or an early-stopping criterion; it
    notifies a webhook (signed; the host must be on the service's allow-list) and/or stops
    the job with a checkpoint. The answer holds the rule's signing secret, shown once."""
    problems = url_problems([spec], services.settings, None)
    if spec.scope.job_id is not None:
        job = get_job(session, spec.scope.job_id)
        if job is None or job.owner != user.name:  # a rule watches its owner's jobs only
            problems.append(
                {
                    "loc": ("scope", "job_id"),
                    "msg": f"no job {clip(spec.scope.job_id)} of yours",
                    "type": "value_error",
                }
            )
    if problems:
        raise ValidationFailed(field_problems(problems))
    (rule,) = create_rules(session, user.name, [spec], services.settings)
    return RuleCreated(**RuleOut.of(rule).model_dump(), secret=rule.secret)


@router.get("/rules", response_model=RulePage, summary="List alert rules")
def list_rules(
    session: SessionDep,
    user: CurrentUser,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=200)] = 100,
) -> RulePage:
    """Your alert rules, oldest first (an admin sees everyone's)."""
    rows = repo.list_rules(session, user.owner_filter, after, limit + 1)
    release_connection(session)
    more = len(rows) > limit
    rows = rows[:limit]
    return RulePage(
        items=[RuleOut.of(r) for r in rows], next_after=rows[-1].id if more and rows else None
    )


RuleId = Annotated[int, Path(ge=1, le=2**62, description="The rule's id.")]
"""Bounded: ids are 64-bit columns, and a larger number would be a 500, not a 404."""


def _visible_rule(session: Session, user: Principal, rule_id: int) -> AlertRule:
    rule = repo.get_rule(session, rule_id)
    if rule is None or not user.can_see(rule):
        raise NotFound(f"no alert rule {rule_id}")
    return rule


@router.get(
    "/rules/{rule_id}",
    response_model=RuleOut,
    responses=error_responses(404),
    summary="Get an alert rule",
)
def read_rule(rule_id: RuleId, session: SessionDep, user: CurrentUser) -> RuleOut:
    """One rule (without its secret)."""
    return RuleOut.of(_visible_rule(session, user, rule_id))


@router.delete(
    "/rules/{rule_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(404),
    summary="Delete an alert rule",
)
def delete_rule(rule_id: RuleId, session: SessionDep, user: CurrentUser) -> Response:
    """Delete a rule, its firings and its deliveries (pending ones are never sent)."""
    _visible_rule(session, user, rule_id)
    repo.delete_rule(session, rule_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/rules/{rule_id}/secret",
    response_model=RuleCreated,
    responses=error_responses(404),
    summary="Rotate a rule's signing secret",
)
def rotate_secret(rule_id: RuleId, session: SessionDep, user: CurrentUser) -> RuleCreated:
    """A new signing secret for the rule, shown once (the old one stops signing now): how
    the owner of a rule created from a job spec's ``alerts`` gets its secret."""
    rule = _visible_rule(session, user, rule_id)
    rule.secret = repo.new_secret()
    session.flush()
    return RuleCreated(**RuleOut.of(rule).model_dump(), secret=rule.secret)


@router.get(
    "/rules/{rule_id}/deliveries",
    response_model=DeliveryPage,
    responses=error_responses(404),
    summary="A rule's webhook deliveries",
)
def rule_deliveries(
    rule_id: RuleId,
    session: SessionDep,
    user: CurrentUser,
    before: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> DeliveryPage:
    """The rule's webhook deliveries, newest first, each with every attempt's outcome."""
    _visible_rule(session, user, rule_id)
    rows = deliveries.deliveries_of(session, rule_id, before, limit + 1)
    release_connection(session)
    more = len(rows) > limit
    rows = rows[:limit]
    return DeliveryPage(
        items=[DeliveryOut(**r) for r in rows],
        next_before=rows[-1]["id"] if more and rows else None,
    )


@router.get("/events", response_model=list[str], summary="Events an alert rule may watch")
def alert_events(user: CurrentUser) -> list[str]:
    """The event names a rule's ``when.events`` may list."""
    return list(ALERT_EVENTS)
