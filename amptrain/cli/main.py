"""The ``amptrain`` command.

Subcommands are imported only when run: ``amptrain train`` needs torch,
``amptrain api`` needs FastAPI, ``amptrain worker`` needs neither on the API
image and the worker image respectively, and ``--help`` needs nothing. A
subcommand whose packages are not installed says which extra to install
(``pip install "amptrain[api]"``) and exits 1, instead of a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

import click

_API = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "redis", "celery", "pydantic_settings")
_STORE = ("sqlalchemy", "alembic", "pydantic_settings")
_CLIENT = ("httpx", "websockets", "rich", "yaml")


@dataclass(frozen=True)
class Lazy:
    """A subcommand loaded on first use."""

    target: str
    """``module:attribute`` of the click command."""
    help: str
    extra: str
    """What ``pip install "amptrain[...]"`` brings the packages in ``needs``."""
    needs: tuple[str, ...]
    """Top-level packages the command imports (checked without importing them: the
    worker's main process must never import torch)."""


COMMANDS: dict[str, Lazy] = {
    "up": Lazy(
        "amptrain.cli.up:up",
        "Run everything on this machine: Redis, database, worker, recorder, API.",
        "api,worker,embedded",
        (*_API, "torch"),
    ),
    "api": Lazy(
        "amptrain.cli.server:api",
        "Run the HTTP API (recorder and dispatcher included).",
        "api",
        _API,
    ),
    "recorder": Lazy(
        "amptrain.cli.server:recorder",
        "Record telemetry into SQL beside the API.",
        "api",
        (*_STORE, "redis"),
    ),
    "db": Lazy("amptrain.cli.server:db", "Database migrations.", "api", _STORE),
    "token": Lazy(
        "amptrain.cli.tokens:token", "Create, list and revoke API tokens.", "api", _STORE
    ),
    "worker": Lazy(
        "amptrain.worker.main.cli:worker",
        "Run a Celery worker that trains jobs.",
        "worker",
        ("celery", "redis", "sqlalchemy", "pydantic_settings", "torch"),
    ),
    "train": Lazy(
        "amptrain.cli.train:train",
        "Train a job spec locally, without any server.",
        "engine",
        ("torch", "numpy", "rich", "yaml"),
    ),
    "submit": Lazy(
        "amptrain.client.commands:submit",
        "Submit a job spec to a server (--watch to follow it).",
        "client",
        _CLIENT,
    ),
    "watch": Lazy(
        "amptrain.client.commands:watch",
        "Follow a job live: progress, loss, loss scale, memory.",
        "client",
        _CLIENT,
    ),
    "jobs": Lazy("amptrain.client.commands:jobs", "List jobs on a server.", "client", _CLIENT),
    "cancel": Lazy(
        "amptrain.client.commands:cancel", "Cancel a job on a server.", "client", _CLIENT
    ),
    "logs": Lazy(
        "amptrain.client.commands:logs", "Print a job's lifecycle events.", "client", _CLIENT
    ),
    "alerts": Lazy(
        "amptrain.client.alerts:alerts",
        "Alert rules: list, add, rm, deliveries.",
        "client",
        _CLIENT,
    ),
    "fork": Lazy(
        "amptrain.client.fork_command:fork",
        "Start a new job from a job's checkpoint, with spec fields changed.",
        "client",
        _CLIENT,
    ),
    "export": Lazy(
        "amptrain.client.export_command:export",
        "Export a job's history (Parquet/CSV), or with NAME its checkpoint's weights.",
        "client",
        _CLIENT,
    ),
}


def missing_package(needs: tuple[str, ...]) -> str | None:
    """The first of ``needs`` that cannot be imported here, or None."""
    for name in needs:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = COMMANDS.get(cmd_name)
        if lazy is None:
            return None
        missing = missing_package(lazy.needs)
        module, attr = lazy.target.split(":")
        if missing is None:
            try:
                command: click.Command = getattr(importlib.import_module(module), attr)
                return command
            except ModuleNotFoundError as exc:
                # Our own modules failing to import is a bug: show it, do not hide it.
                missing = (exc.name or "").partition(".")[0]
                if not missing or missing == __name__.partition(".")[0]:
                    raise
        click.echo(
            f'amptrain {cmd_name} needs the "{lazy.extra}" extra ({missing} is not '
            f'installed): pip install "amptrain[{lazy.extra}]"',
            err=True,
        )
        ctx.exit(1)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import the commands (that would import torch for --help).
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name].help) for name in sorted(COMMANDS)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="amptrain")
def main() -> None:
    """amptrain: declarative PyTorch training jobs with automatic mixed precision."""


if __name__ == "__main__":
    main()
