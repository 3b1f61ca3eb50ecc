"""``amptrain export JOB [--format parquet|csv] [-o FILE]``: a job's whole metric history as
one file (``GET /jobs/{id}/metrics/export``, streamed to disk as it arrives); and
``amptrain export JOB NAME [--step K]``: a checkpoint's weights as safetensors in the
caller's weights root, for the next job's ``weights.path``."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import click

from amptrain.client.commands import connection_options, console, fail, make_client, resolved_id
from amptrain.client.http import ApiError, Client

STDOUT = "-"


@click.command()
@click.argument("job_id")
@click.argument("name", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "csv"]),
    help="The history's format (default parquet): columns kind, series, step, value.",
)
@click.option(
    "-o",
    "--output",
    help="Where the history goes (default JOB_ID.FORMAT here; - for standard output).",
)
@click.option(
    "--step", type=click.IntRange(0), help="With NAME: the checkpoint's step (default: the newest)."
)
@connection_options
def export(
    job_id: str,
    name: str | None,
    fmt: str | None,
    output: str | None,
    step: int | None,
    url: str | None,
    token: str | None,
) -> None:
    """Write a job's whole metric history at full resolution (every step field, evaluation
    metric and layer norm, one row per series and step) to a Parquet or CSV file for
    pandas or polars. With NAME instead: export the job's checkpoint as safetensors into
    your weights root as NAME and print the ``weights.path`` a next job starts from. JOB_ID
    may be a unique prefix of the id."""
    if name is not None and (fmt or output):
        raise click.UsageError("--format and -o export the history; drop them to export weights")
    if name is None and step is not None:
        raise click.UsageError("--step names a checkpoint: give the weights' NAME too")
    client = make_client(url, token)
    try:
        whole = resolved_id(client, job_id)
        if name is not None:
            done = client.export(whole, name, step)
            click.echo(f"weights.path: {done['path']}  ({done['size']} bytes)")
            return
        fmt = fmt or "parquet"
        target = output or f"{whole}.{fmt}"
        size = _history(client, whole, fmt, target)
    except ApiError as exc:
        fail(exc)
    if target != STDOUT:
        console.print(f"{target}: {size} bytes")


def _history(client: Client, job_id: str, fmt: str, target: str) -> int:
    """Stream the export to ``target``: standard output, or a file that appears only once
    whole (written beside it, then renamed), so a cut download never looks complete."""
    path, params = f"/jobs/{job_id}/metrics/export", {"format": fmt}
    if target == STDOUT:
        return client.download(path, params, sys.stdout.buffer)
    final = Path(target)
    fd, part = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            size = client.download(path, params, out)
        os.replace(part, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
        raise
    return size
