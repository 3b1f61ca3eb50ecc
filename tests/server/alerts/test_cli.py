"""``amptrain alerts list|add|rm|deliveries`` against a real API."""

from __future__ import annotations

import json
from pathlib import Path

from tests.client.test_client_cli import amptrain
from tests.support.stack import Stack


def test_alerts_commands(stack: Stack, tmp_path: Path) -> None:
    added = amptrain(stack, "alerts", "add", "--event", "diverged", "--event", "failed", "--stop")
    assert added.returncode == 0, added.stderr
    rule_id = int(added.stdout.split()[1])
    assert "secret (shown once" in added.stdout

    refused = amptrain(
        stack, "alerts", "add", "--event", "failed", "--webhook", "https://example.com/x"
    )
    assert refused.returncode == 2 and "notify.url" in refused.stderr, refused.stderr

    rule_file = tmp_path / "rule.yaml"
    rule_file.write_text(
        "name: plateau\nwhen: {kind: early_stop, series: eval_loss, patience: 3}\n"
        "scope: {name: 'exp-*'}\n"
    )
    assert amptrain(stack, "alerts", "add", str(rule_file)).returncode == 0

    listed = json.loads(amptrain(stack, "alerts", "list", "--json").stdout)
    assert [r["name"] for r in listed] == ["diverged+failed", "plateau"]
    table = amptrain(stack, "alerts", "list").stdout
    assert "jobs exp-*" in table and "early_stop" in table

    assert json.loads(amptrain(stack, "alerts", "deliveries", str(rule_id), "--json").stdout) == []
    assert amptrain(stack, "alerts", "rm", str(rule_id)).returncode == 0
    gone = amptrain(stack, "alerts", "rm", str(rule_id))
    assert gone.returncode == 2 and "no alert rule" in gone.stderr
