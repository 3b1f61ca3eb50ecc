"""Alert rules in SQL: create, list, delete (always by owner), and the rules that watch a
batch's jobs (read once per recorder batch, not per point).

Functions take a Session and never commit: the caller owns the transaction.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session

from amptrain.contract.alerts import JobAlert, RuleSpec
from amptrain.core.enums import FINISHED_STATUSES
from amptrain.store.models import AlertRule, Job

log = logging.getLogger(__name__)


class TooManyRules(Exception):
    """The owner has :data:`~amptrain.contract.alerts.MAX_RULES_PER_OWNER` rules."""


def new_secret() -> str:
    """A rule's signing secret: 32 random bytes as hex, shown to its owner once."""
    return secrets.token_hex(32)


def create_rule(
    s: Session, owner: str, spec: RuleSpec | JobAlert, limit: int, job_id: str | None = None
) -> AlertRule:
    """Add a rule of ``owner`` (``job_id``: scoped to that job, which must be the owner's:
    the caller checked). Raises :class:`TooManyRules` beyond ``limit`` rules per owner."""
    # Rules of finished jobs (a spec's ``alerts``, ``scope.job_id``) watch nothing any
    # more: they do not count, or every job submitted with alerts would use the limit up.
    r = AlertRule
    live = sa.or_(r.job_id.is_(None), Job.status.not_in([str(x) for x in FINISHED_STATUSES]))
    count = (
        s.scalar(
            sa.select(sa.func.count())
            .select_from(r)
            .outerjoin(Job, Job.id == r.job_id)
            .where(r.owner == owner, live)
        )
        or 0
    )
    if count >= limit:
        raise TooManyRules(f"{owner} already has {count} alert rules (at most {limit})")
    scoped = job_id or (spec.scope.job_id if isinstance(spec, RuleSpec) else None)
    rule = AlertRule(
        owner=owner,
        name=spec.name,
        kind=spec.when.kind,
        job_id=scoped,
        spec=spec.model_dump(mode="json"),
        secret=new_secret(),
    )
    s.add(rule)
    s.flush()
    return rule


def list_rules(s: Session, owner: str | None, after_id: int, limit: int) -> list[AlertRule]:
    """Rules with an id above ``after_id``, oldest first; ``owner`` None: everyone's (admin)."""
    query = sa.select(AlertRule).where(AlertRule.id > after_id)
    if owner is not None:
        query = query.where(AlertRule.owner == owner)
    return list(s.scalars(query.order_by(AlertRule.id).limit(limit)))


def get_rule(s: Session, rule_id: int) -> AlertRule | None:
    return s.get(AlertRule, rule_id)


def delete_rule(s: Session, rule_id: int) -> None:
    """Delete the rule with its firings and deliveries (pending ones are never sent)."""
    from amptrain.store.models import AlertDelivery, AlertFiring

    s.execute(sa.delete(AlertDelivery).where(AlertDelivery.rule_id == rule_id))
    s.execute(sa.delete(AlertFiring).where(AlertFiring.rule_id == rule_id))
    s.execute(sa.delete(AlertRule).where(AlertRule.id == rule_id))


@dataclass(frozen=True)
class Watch:
    """A rule as the recorder evaluates it: parsed once per batch."""

    id: int
    name: str
    spec: RuleSpec

    @property
    def kind(self) -> str:
        return self.spec.when.kind


@dataclass(frozen=True)
class WatchedJob:
    id: str
    name: str
    owner: str
    status: str
    attempt: int


def rules_for_jobs(
    s: Session, job_ids: Iterable[str], kinds: Iterable[str] | None = None
) -> dict[str, tuple[WatchedJob, list[Watch]]]:
    """Per job, the job and the rules that watch it: its owner's rules whose scope is
    all jobs, a pattern its name matches, or this job. Never another owner's rule. One
    query whatever the number of jobs and rules; each rule's spec is parsed once."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    r = AlertRule
    # One query: the batch's jobs joined to their owners' rules (nothing when none has any).
    query = (
        sa.select(
            Job.id, Job.name, Job.owner, Job.status, Job.attempt, r.id, r.name, r.job_id, r.spec
        )
        .join(r, r.owner == Job.owner)
        .where(Job.id.in_(ids), sa.or_(r.job_id.is_(None), r.job_id == Job.id))
        .order_by(Job.id, r.id)
    )
    if kinds is not None:
        query = query.where(r.kind.in_(list(kinds)))
    out: dict[str, tuple[WatchedJob, list[Watch]]] = {}
    parsed: dict[int, Watch] = {}
    for jid, jname, owner, status, attempt, rid, rname, rule_job, spec in s.execute(query):
        watch = parsed.get(rid)
        if watch is None:
            try:
                watch = parsed[rid] = Watch(rid, rname, RuleSpec.model_validate(spec))
            except ValidationError:
                # Valid when created; a later release may bound it tighter. One stale rule
                # must never stop the recorder (this runs in its batch transaction).
                log.warning("alert rule %d no longer validates; skipped", rid)
                continue
        job = WatchedJob(jid, jname, owner, status, attempt)
        if _applies(watch, rule_job, job):
            out.setdefault(jid, (job, []))[1].append(watch)
    return out


def _applies(watch: Watch, rule_job: str | None, job: WatchedJob) -> bool:
    if rule_job is not None:
        return rule_job == job.id
    pattern = watch.spec.scope.name
    return pattern is None or fnmatchcase(job.name, pattern)
