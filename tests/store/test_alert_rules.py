"""The rules that watch a batch's jobs: only their owner's, by scope; the per-owner limit
counts only rules that can still fire; a firing is stored once however often it is replayed."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.alerts import JobAlert, RuleSpec
from amptrain.contract.spec import parse_spec
from amptrain.store import alert_rules, deliveries, jobs
from tests.support.specs import mlp_job


def _job(s: Session, owner: str, name: str) -> str:
    return jobs.create_job(s, parse_spec(mlp_job(name=name)), owner, "cpu").id


def _rule(**overrides: object) -> RuleSpec:
    body = {"name": "r", "when": {"kind": "event", "events": ["failed"]}, "stop": True}
    return RuleSpec.model_validate({**body, **overrides})


def test_rules_watch_only_their_owners_jobs_by_scope(sf: sessionmaker[Session]) -> None:
    with sf.begin() as s:
        a1, a2, b1 = _job(s, "alice", "exp-1"), _job(s, "alice", "prod"), _job(s, "bob", "exp-1")
        every = alert_rules.create_rule(s, "alice", _rule(name="all"), 10).id
        exp = alert_rules.create_rule(s, "alice", _rule(scope={"name": "exp-*"}), 10).id
        one = alert_rules.create_rule(s, "alice", _rule(scope={"job_id": a2}), 10).id
        bobs = alert_rules.create_rule(s, "bob", _rule(scope={"name": "prod"}), 10).id
    with sf() as s:
        watched = alert_rules.rules_for_jobs(s, [a1, a2, b1])
    ids = {job: [w.id for w in ws] for job, (_, ws) in watched.items()}
    assert ids == {a1: [every, exp], a2: [every, one]}  # bob's exp-1 matches no rule of his
    assert bobs not in {i for v in ids.values() for i in v}


def test_the_limit_counts_rules_that_can_still_fire(sf: sessionmaker[Session]) -> None:
    alert = JobAlert.model_validate(
        {"name": "es", "when": {"kind": "early_stop", "series": "eval_loss"}}
    )
    with sf.begin() as s:
        job = _job(s, "alice", "x")
        alert_rules.create_rule(s, "alice", alert, 2, job_id=job)
        alert_rules.create_rule(s, "alice", alert, 2, job_id=job)
        with pytest.raises(alert_rules.TooManyRules):
            alert_rules.create_rule(s, "alice", _rule(), 2)
        attempt = jobs.claim(s, job, "w", 30)
        assert attempt is not None and jobs.finish(s, job, attempt, "succeeded")
        alert_rules.create_rule(s, "alice", _rule(), 2)  # the finished job's rules are spent


def test_a_replayed_firing_is_stored_once(sf: sessionmaker[Session]) -> None:
    notify = {"url": "https://hooks.example.com/x", "format": "json", "max_retries": 2}
    with sf.begin() as s:
        job = _job(s, "alice", "x")
        rule = alert_rules.create_rule(s, "alice", _rule(), 10).id
        first = deliveries.fire(s, rule, job, 1, "step:5", 5, {}, notify)
        assert first is not None
        assert deliveries.fire(s, rule, job, 1, "step:5", 5, {}, notify) is None
        assert deliveries.fire(s, rule, job, 2, "step:5", 5, {}, notify) is not None
    with sf.begin() as s:
        due = deliveries.claim(s, 10, 30)
        assert len(due) == 2 and deliveries.claim(s, 10, 30) == []  # held by the first claim
        assert deliveries.record_attempt(s, due[0], {"error": "x"}, False, 0.0)
        assert not deliveries.record_attempt(s, due[0], {"error": "x"}, False, 0.0)  # claim spent


def test_a_rule_that_no_longer_validates_is_skipped(sf: sessionmaker[Session]) -> None:
    with sf.begin() as s:
        job = _job(s, "alice", "x")
        stale = alert_rules.create_rule(s, "alice", _rule(name="stale"), 10)
        good = alert_rules.create_rule(s, "alice", _rule(name="good"), 10).id
        stale.spec = {**stale.spec, "when": {"kind": "deviation", "series": "loss", "z": -1}}
    with sf() as s:
        (_, watches) = alert_rules.rules_for_jobs(s, [job])[job]
    assert [w.id for w in watches] == [good]
