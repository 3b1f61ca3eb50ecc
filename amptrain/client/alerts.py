"""``amptrain alerts list|add|rm|deliveries``: a user's alert rules on a running server.

``add`` takes a rule file (JSON or YAML, the body of ``POST /alerts/rules``) or, for the
common case, flags: ``--event diverged --webhook https://hooks.example.com/x --stop``. The
rule's signing secret is printed once, when it is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from amptrain.client.commands import connection_options, fail, fetch_listing, make_client
from amptrain.client.http import ApiError
from amptrain.contract.alerts import ALERT_EVENTS
from amptrain.contract.spec_file import load_spec_file


@click.group()
def alerts() -> None:
    """Alert rules: webhooks and stops on your jobs' events and series."""


@alerts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the rules as one JSON array.")
@connection_options
def list_rules(as_json: bool, url: str | None, token: str | None) -> None:
    """List your alert rules."""
    empty = "No alert rules yet. Add one: amptrain alerts add --help"
    rules = fetch_listing(lambda: make_client(url, token).alert_rules(), as_json, empty)
    if rules is None:
        return
    table = Table("id", "name", "kind", "scope", "actions", box=box.SIMPLE, pad_edge=False)
    for r in rules:
        table.add_row(str(r["id"]), r["name"], r["kind"], _scope(r), _actions(r["spec"]))
    Console().print(table)


def _scope(rule: dict[str, Any]) -> str:
    if rule["job_id"]:
        return f"job {rule['job_id']}"
    pattern = (rule["spec"].get("scope") or {}).get("name")
    return f"jobs {pattern}" if pattern else "all jobs"


def _actions(spec: dict[str, Any]) -> str:
    acts = []
    if spec.get("notify"):
        acts.append(f"notify {spec['notify']['url']}")
    if spec.get("stop") or spec["when"]["kind"] == "early_stop":
        acts.append("stop")
    return ", ".join(acts)


@alerts.command("add")
@click.argument(
    "rule_file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--name", help="The rule's name (with flags).")
@click.option(
    "--event",
    "events",
    multiple=True,
    type=click.Choice(ALERT_EVENTS),
    help="Fire on this event (repeatable).",
)
@click.option("--webhook", "hook", help="URL to notify (its host must be allow-listed).")
@click.option("--slack", is_flag=True, help="Send a Slack-compatible body.")
@click.option("--stop", is_flag=True, help="Stop the job (with a checkpoint) when it fires.")
@click.option("--jobs", "pattern", help="Only jobs whose name matches (* and ?).")
@click.option("--job", "job_id", help="Only this job.")
@connection_options
def add(
    rule_file: Path | None,
    name: str | None,
    events: tuple[str, ...],
    hook: str | None,
    slack: bool,
    stop: bool,
    pattern: str | None,
    job_id: str | None,
    url: str | None,
    token: str | None,
) -> None:
    """Add a rule from RULE_FILE, or an event rule from the flags."""
    if rule_file is not None:
        try:
            rule = load_spec_file(rule_file)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="RULE_FILE") from None
    else:
        if not events:
            raise click.UsageError("give a RULE_FILE, or --event (and --webhook and/or --stop)")
        rule = {"name": name or "+".join(events), "when": {"kind": "event", "events": list(events)}}
        if hook:
            rule["notify"] = {"url": hook, "format": "slack" if slack else "json"}
        rule["stop"] = stop
        scope = {k: v for k, v in (("name", pattern), ("job_id", job_id)) if v}
        if scope:
            rule["scope"] = scope
    try:
        created = make_client(url, token).add_alert_rule(rule)
    except ApiError as exc:
        fail(exc)
    click.echo(f"rule {created['id']} {created['name']}")
    click.echo(f"secret (shown once; signs its webhooks): {created['secret']}")


@alerts.command("rm")
@click.argument("rule_id", type=click.IntRange(1))
@connection_options
def remove(rule_id: int, url: str | None, token: str | None) -> None:
    """Delete a rule (its pending deliveries are not sent)."""
    try:
        make_client(url, token).delete_alert_rule(rule_id)
    except ApiError as exc:
        fail(exc)
    click.echo(f"rule {rule_id} deleted")


@alerts.command("deliveries")
@click.argument("rule_id", type=click.IntRange(1))
@click.option(
    "--limit",
    default=20,
    show_default=True,
    type=click.IntRange(1, 200),
    help="Newest deliveries to list.",
)
@click.option("--json", "as_json", is_flag=True, help="Print them as one JSON array.")
@connection_options
def deliveries(rule_id: int, limit: int, as_json: bool, url: str | None, token: str | None) -> None:
    """A rule's webhook deliveries, newest first, with their last outcome."""
    empty = f"No deliveries of rule {rule_id} yet: it has not fired."
    fetch = lambda: make_client(url, token).alert_deliveries(rule_id, limit)  # noqa: E731
    items = fetch_listing(fetch, as_json, empty)
    if items is None:
        return
    table = Table("id", "job", "step", "status", "attempts", "last", box=box.SIMPLE, pad_edge=False)
    for d in items:
        last = d["history"][-1] if d["history"] else {}
        outcome = str(last.get("status_code") or last.get("error") or "")
        table.add_row(
            str(d["id"]), d["job_id"], str(d["step"]), d["status"], str(d["attempts"]), outcome[:60]
        )
    Console().print(table)
