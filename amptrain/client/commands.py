"""``amptrain submit|watch|jobs|cancel|logs``: the command-line client of a running server.

Server and token: ``--url``/``--token``, else ``AMPTRAIN_URL``/``AMPTRAIN_TOKEN``, else
``~/.config/amptrain/config.toml``, else the data directory's admin token (see
:mod:`amptrain.client.http`). Exit codes: 0 success (``watch``: the job succeeded), 1 the job
failed or was cancelled, 2 a bad request (e.g. an invalid spec), 3 server unreachable
or refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich import box
from rich.console import Console
from rich.table import Table

from amptrain.client.event_lines import (
    collapsed,
    eval_headline,
    eval_line,
    event_line,
    layer_norms_line,
    with_headline,
)
from amptrain.client.http import ApiError, Client, resolve_config
from amptrain.client.progress_bar import bar, job_times, placed, short, stats_room
from amptrain.contract.progress import LAST_LOSS_LABEL, ProgressView, progress_line
from amptrain.contract.spec_file import load_spec_file

F = TypeVar("F", bound=Callable[..., Any])
console = Console(stderr=True)


def connection_options(fn: F) -> F:
    fn = click.option(
        "--token", help="API token (default: AMPTRAIN_TOKEN, config file, data dir)."
    )(fn)
    fn = click.option(
        "--url",
        help="Server URL (default: AMPTRAIN_URL, config file, the running `amptrain up` of "
        "the data directory, http://127.0.0.1:8000).",
    )(fn)
    return fn


def make_client(url: str | None, token: str | None) -> Client:
    return Client(resolve_config(url, token))


def fail(exc: ApiError) -> NoReturn:
    detail = exc.detail
    if isinstance(detail, list):  # 422: one line per field
        for problem in detail:
            console.print(f"[red]{problem.get('field')}[/]: {problem.get('message')}")
    else:
        console.print(f"[red]error[/] {exc.code}: {detail}")
    sys.exit(2 if 400 <= exc.status < 500 and exc.status not in (401, 403) else 3)


def fetch_listing(
    fetch: Callable[[], list[dict[str, Any]]], as_json: bool, empty: str = ""
) -> list[dict[str, Any]] | None:
    """The items ``fetch`` asks the API for (an error ends the command: :func:`fail`). With
    ``--json`` they are printed as one JSON array and None is returned: nothing is left to
    print; so it is when there are none, after ``empty`` (what to do next) is printed."""
    try:
        items = fetch()
    except ApiError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(items, indent=2))
        return None
    if not items and empty:
        click.echo(empty)  # a header over nothing said nothing
        return None
    return items


def show_queued(client: Client, job: dict[str, Any], follow: bool) -> None:
    """Print a new job's id (and the service's note on it); with ``--watch`` follow it live
    until it ends and exit with its status."""
    click.echo(job["id"])
    if job.get("notice"):
        console.print(f"[yellow]note[/] {job['notice']}")
    if follow:
        sys.exit(watch_job(client, job["id"], as_json=False))


def load_spec(path: Path) -> dict[str, Any]:
    try:
        return load_spec_file(path)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SPEC") from None


@click.command()
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--watch", "follow", is_flag=True, help="Follow the job live until it ends.")
@click.option("--idempotency-key", help="Re-running with the same key returns the same job.")
@connection_options
def submit(
    spec: Path, follow: bool, idempotency_key: str | None, url: str | None, token: str | None
) -> None:
    """Submit the job spec in SPEC (.json, .yaml or .yml) and print its id."""
    client = make_client(url, token)
    try:
        job = client.submit(load_spec(spec), idempotency_key)
    except ApiError as exc:
        fail(exc)
    show_queued(client, job, follow)


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print every message as one JSON line.")
@click.option(
    "--from-start",
    is_flag=True,
    help="Replay the job's whole history first [default: start at its newest point].",
)
@connection_options
def watch(job_id: str, as_json: bool, from_start: bool, url: str | None, token: str | None) -> None:
    """Follow a job live: progress, loss, loss scale, skipped steps, memory, samples/s.
    JOB_ID may be a unique prefix of the id."""
    client = make_client(url, token)
    sys.exit(watch_job(client, resolved_id(client, job_id), as_json, from_start))


def resolved_id(client: Client, ref: str) -> str:
    """The whole id of the job ``ref`` names (an id or a unique prefix of one)."""
    try:
        return client.resolve(ref)
    except ApiError as exc:
        fail(exc)


def watch_job(client: Client, job_id: str, as_json: bool, from_start: bool = True) -> int:
    try:
        job = client.job(job_id)
        if job.get("forked_from"):
            console.print(f"{job['name']}{lineage(job)}: its own steps follow that checkpoint")
        # A watch joins a running job where it is now: replaying 60,000 steps first showed
        # nothing current and a meaningless ETA.
        after = None if from_start else client.newest_cursor(job_id)
        seen = set() if as_json else _past_events(client, job_id)
        return asyncio.run(_follow(client, job, as_json, after, seen))
    except ApiError as exc:
        fail(exc)
    except KeyboardInterrupt:
        console.print(f"stopped watching; the job goes on (amptrain watch {job_id})")
    return 130


async def _follow(
    client: Client,
    job: dict[str, Any],
    as_json: bool,
    after: str | None = None,
    seen: Collection[tuple[Any, ...]] = (),
) -> int:
    """Follow ``job`` live from ``after``; ``seen``: the events already printed (by
    :func:`event_key`), not printed again when the stream replays them."""

    def reconnecting(cursor: str | None, reason: str) -> None:
        console.print(f"[dim]{reason}; resuming after {cursor}[/]")

    status = "unknown"
    with bar(console, disable=as_json) as progress:
        name = short(job["name"])
        room = stats_room(progress.console.width, name, job["max_steps"])
        since, until = job_times(job)
        task = progress.add_task(
            name,
            total=job["max_steps"],
            completed=job["step"],
            stats="…",
            below="",
            since=since,
            until=until,
        )
        point: dict[str, Any] | None = None
        view = ProgressView()  # smoothed loss, steady-state samples/s
        headline = None  # the newest evaluation's accuracy (or loss), kept in view

        def fields(point: dict[str, Any]) -> dict[str, Any]:
            line = functools.partial(progress_line, point, smoothed_loss=True)
            whole = functools.partial(with_headline, line, headline)
            return placed(lambda w: whole(UNCUT_WIDTH if w is None else w), room, width)

        width = progress.console.width
        async for msg in client.watch(job["id"], after=after, on_reconnect=reconnecting):
            if as_json:
                click.echo(json.dumps(msg))
            if msg["type"] == "metric":
                point = view.add(msg["data"])
                progress.update(task, completed=point["step"], **fields(point))
            elif msg["type"] == "eval":
                headline = eval_headline(msg["data"]["values"])
                if point is not None:
                    progress.update(task, **fields(point))
                if not as_json:
                    progress.console.print(eval_line(msg["data"], progress.console.width))
            elif msg["type"] == "layer_grad_norm" and not as_json:
                progress.console.print(layer_norms_line(msg["data"], progress.console.width))
            elif msg["type"] == "event" and not as_json and event_key(msg["data"]) not in seen:
                progress.console.print(event_line(msg["data"], progress.console.width))
                if msg["data"]["type"] == "started" and not job.get("started_at"):
                    job["started_at"] = msg["data"]["time"]  # its clock runs from here on
                    progress.update(task, since=msg["data"]["time"])
            elif msg["type"] == "end":
                until = until or time.time()
                progress.update(task, until=until)
                status = msg["data"]["status"]
                if status == "succeeded":
                    progress.update(task, completed=msg["data"].get("step") or job["max_steps"])
    error = None
    if status != "succeeded":
        error = client.job(job["id"]).get("error")
    colour = "green" if status == "succeeded" else "red"
    console.print(f"[{colour}]{job['id']} {status}[/]" + (f": {error['message']}" if error else ""))
    return 0 if status == "succeeded" else 1


def event_key(ev: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one event from another in both the API's list and the live stream (the
    stream's copy may not have the row's id yet)."""
    return (ev.get("attempt"), ev.get("type"), ev.get("step"), ev.get("time"))


def _past_events(client: Client, job_id: str) -> set[tuple[Any, ...]]:
    """Print the events the job already had (a watch joins it where it is: what happened
    before, started, fell back, is told first), and return their keys."""
    past = client.events(job_id)
    width = console.width if console.is_terminal else None
    for ev in collapsed(past):
        console.print(event_line(ev, width), soft_wrap=True)
    return {event_key(ev) for ev in past}


UNCUT_WIDTH = 10_000
ID_SHOWN = 12
"""At a narrow terminal ``amptrain jobs`` shows at least this much of each id (``j_`` and
nine hex digits, then …): enough to be a unique prefix to type back."""
"""Output width when it is not a terminal: a table takes only what its cells need."""


def _num(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4g}"


@click.command()
@click.option("--status", help="Only jobs in these states (comma-separated).")
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 200),
    help="Newest jobs to list.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as one JSON array.")
@connection_options
def jobs(status: str | None, limit: int, as_json: bool, url: str | None, token: str | None) -> None:
    """List jobs, newest first (ids whole when the output is not a terminal)."""
    none = f"No {status} jobs." if status else "No jobs yet."
    empty = f"{none} Submit one: amptrain submit amptrain/examples/mlp.yaml --watch"
    items = fetch_listing(lambda: make_client(url, token).jobs(status, limit), as_json, empty)
    if items is None:
        return
    out = Console()
    # Piped or redirected, nothing is cut: a script reads whole ids. At a terminal a
    # narrow table may shorten them; any unique prefix is accepted back.
    if not out.is_terminal:
        out = Console(width=UNCUT_WIDTH)
    # No vertical rules: at 80 columns their 22 characters are what the id and time need.
    table = Table(
        "id",
        "name",
        "status",
        "step",
        "precision",
        LAST_LOSS_LABEL,
        "age",
        box=box.SIMPLE,
        pad_edge=False,
    )
    # The id keeps enough to be a unique prefix; the name gives way first.
    table.columns[0].min_width = ID_SHOWN
    for j in items:
        table.add_row(
            j["id"],
            j["name"] + lineage(j),
            j["status"],
            f"{j['step']}/{j['max_steps']}",
            j["precision"]["effective"] or j["precision"]["requested"] or "",
            _num(j["summary"]["loss"]),
            _age(j["created_at"]),
        )
    out.print(table)


def lineage(job: dict[str, Any]) -> str:
    """`` ⑂ j_3f2a9c01b@500`` for a fork (its parent's id as ``amptrain jobs`` shortens it
    at a terminal, and the step), else nothing."""
    origin = job.get("forked_from")
    return f" ⑂ {origin['job'][: ID_SHOWN - 1]}@{origin['step']}" if origin else ""


def _age(created_at: str) -> str:
    """How long ago (``42s``, ``5m``, ``3h``, ``2d``): four characters at most, where a
    timestamp took nineteen of an 80-column table (``--json`` keeps the timestamp)."""
    then = datetime.fromisoformat(created_at)
    seconds = max(0, int((datetime.now(then.tzinfo or UTC) - then).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@click.command()
@click.argument("job_id")
@connection_options
def cancel(job_id: str, url: str | None, token: str | None) -> None:
    """Cancel a job (a running one stops at its next step boundary). JOB_ID may be a
    unique prefix of the id."""
    client = make_client(url, token)
    try:
        job = client.cancel(resolved_id(client, job_id))
    except ApiError as exc:
        fail(exc)
    click.echo(f"{job['id']} {job['status']}")


@click.command()
@click.argument("job_id")
@click.option(
    "--json", "as_json", is_flag=True, help="Print every event whole, one JSON line each."
)
@connection_options
def logs(job_id: str, as_json: bool, url: str | None, token: str | None) -> None:
    """Print a job's lifecycle events (queued, started, checkpoint, warning, ...), one line
    each, runs of checkpoints as one. JOB_ID may be a unique prefix of the id."""
    client = make_client(url, token)
    try:
        events = client.events(resolved_id(client, job_id))
    except ApiError as exc:
        fail(exc)
    if as_json:
        for ev in events:
            click.echo(json.dumps(ev))
        return
    out = Console(highlight=False)
    width = out.width if out.is_terminal else None
    for ev in collapsed(events):
        out.print(event_line(ev, width), soft_wrap=True)
