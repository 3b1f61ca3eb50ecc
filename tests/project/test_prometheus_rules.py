"""deploy/k8s/monitoring's PrometheusRule: it parses, and every metric its expressions
name is one the service really exports.

promtool is not installed here, so the check is ours: the YAML is parsed, each rule's
shape checked, and every ``amptrain_*`` name in an expression looked up among the names
the real exporters produce (the API's collector over a real SQLite and Redis, and the
worker's slot collector), with the suffixes their types give in the text format
(``_bucket``/``_sum``/``_count`` of a histogram, ``_total`` of a counter)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.server import observability
from amptrain.worker.main.metrics import SlotCollector

RULES = (
    Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "monitoring" / "prometheus-rules.yaml"
)
SUFFIXES = {
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "unknown": ("",),
}
NAME = re.compile(r"\bamptrain_[a-z0-9_]+\b")


@pytest.fixture
def exported(sf: sessionmaker[Session], session_redis: EmbeddedRedis) -> set[str]:
    client = redis.Redis.from_url(session_redis.url)
    try:
        api = observability.make_registry(
            observability.ServiceCollector(sf, client, ["gpu"], lambda: (0, 0))
        )
        worker = CollectorRegistry()
        worker.register(SlotCollector(client, "w@test", 1))
        text = observability.exposition(api).decode() + generate_latest(worker).decode()
    finally:
        client.close()
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in SUFFIXES[family.type]}
    return names


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def test_every_rule_names_only_exported_metrics(exported: set[str]) -> None:
    rules = _rules()
    assert {"AmptrainJobsFailing", "AmptrainRecorderLagging", "AmptrainQueueWaitHigh"} <= {
        r["alert"] for r in rules
    }
    assert {"AmptrainWorkersGone", "AmptrainWebhooksFailing"} <= {r["alert"] for r in rules}
    for rule in rules:
        expr = str(rule["expr"])
        assert expr.count("(") == expr.count(")"), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule["for"])), rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}  # type: ignore[index]
        used = set(NAME.findall(expr))
        assert used, f"{rule['alert']} names no amptrain metric"
        assert used <= exported, f"{rule['alert']}: not exported: {sorted(used - exported)}"


def test_the_check_is_not_a_rubber_stamp(exported: set[str]) -> None:
    assert "amptrain_recorder_lag_seconds_bucket" in exported
    assert "amptrain_worker_slots" in exported and "amptrain_jobs" in exported
    assert "amptrain_webhook_attempts_total" in exported
    assert "amptrain_recorder_lag_bucket" not in exported


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    doc = yaml.safe_load(RULES.read_text())
    plain = tmp_path / "rules.yaml"
    plain.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    subprocess.run(["promtool", "check", "rules", str(plain)], check=True)
