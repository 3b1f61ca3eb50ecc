"""``amptrain fork JOB --step K --set optimizer.lr=0.0005``: a new job from a checkpoint.

``--set`` takes a dotted spec path and a value, read as JSON when it is JSON (``0.0005``,
``true``, ``{"name": "sgd"}``) and as text otherwise (``precision=bf16``); ``--overrides``
a JSON or YAML file of them as a mapping; ``--set`` wins over the file. What may change is
the server's to say (a 422 naming ``overrides.<field>``); see ``POST /jobs/{id}/fork``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from amptrain.client.commands import (
    connection_options,
    console,
    fail,
    load_spec,
    make_client,
    resolved_id,
    show_queued,
)
from amptrain.client.http import ApiError

MAX_SETS = 64
MAX_PATH_PARTS = 4
"""As deep as the server takes overrides."""


def parse_set(text: str) -> tuple[list[str], Any]:
    """``optimizer.lr=0.0005`` -> (``["optimizer", "lr"]``, ``0.0005``)."""
    path, sep, raw = text.partition("=")
    parts = path.strip().split(".")
    if not sep or not all(parts) or len(parts) > MAX_PATH_PARTS:
        raise click.BadParameter(
            f"{text[:60]!r}: expected FIELD=VALUE, FIELD a dotted path of at most "
            f"{MAX_PATH_PARTS} names (optimizer.lr=0.0005)",
            param_hint="--set",
        )
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return parts, value


def overrides_of(sets: tuple[str, ...], file: Path | None) -> dict[str, Any]:
    """The request's ``overrides``: the file's, then each ``--set`` merged in."""
    out: dict[str, Any] = load_spec(file) if file is not None else {}
    for text in sets:
        parts, value = parse_set(text)
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = child = child if isinstance(child, dict) else {}
            node = child
        node[parts[-1]] = value
    return out


@click.command()
@click.argument("job_id")
@click.option("--step", required=True, type=click.IntRange(0), help="The checkpoint's step.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="A spec field to change.")
@click.option(
    "--overrides",
    "file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A JSON or YAML file of spec fields to change.",
)
@click.option("--name", help="The fork's name (default: the parent's with @STEP).")
@click.option("--watch", "follow", is_flag=True, help="Follow the fork live until it ends.")
@connection_options
def fork(
    job_id: str,
    step: int,
    sets: tuple[str, ...],
    file: Path | None,
    name: str | None,
    follow: bool,
    url: str | None,
    token: str | None,
) -> None:
    """Start a new job from JOB_ID's checkpoint at --step, with spec fields changed
    (optimizer, schedule, precision, max_steps, eval, ...; never the model or the data),
    and print its id. JOB_ID may be a unique prefix of the id."""
    if len(sets) > MAX_SETS:
        raise click.BadParameter(f"at most {MAX_SETS}", param_hint="--set")
    body: dict[str, Any] = {"step": step, "overrides": overrides_of(sets, file)}
    if name is not None:
        body["name"] = name
    client = make_client(url, token)
    try:
        job = client.fork(resolved_id(client, job_id), body)
    except ApiError as exc:
        if isinstance(exc.detail, dict) and "forkable_steps" in exc.detail:
            steps = ", ".join(str(s) for s in exc.detail["forkable_steps"]) or "none"
            console.print(f"[red]error[/] {exc.detail.get('message')}; forkable steps: {steps}")
            sys.exit(2)
        fail(exc)
    show_queued(client, job, follow)
