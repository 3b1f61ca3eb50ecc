"""The ``amptrain`` command.

Subcommands are imported only when run: ``amptrain train`` needs torch,
``amptrain api`` needs FastAPI, ``amptrain worker`` needs neither on the API
image and the worker image respectively, and ``--help`` needs nothing.
"""

from __future__ import annotations

import importlib

import click

# name -> ("module:attribute" of a click command, one-line help); loaded on first use.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": (
        "api.cli.up:up",
        "Run everything on this machine: Redis, database, one worker, the API.",
    ),
    "api": ("api.cli.server:api", "Run the HTTP API (recorder and dispatcher included)."),
    "db": ("api.cli.server:db", "Database migrations."),
    "token": ("api.cli.server:token", "Manage API tokens."),
    "worker": ("worker.main.cli:worker", "Run a Celery worker that trains jobs."),
    "train": ("trainer_core.cli:train", "Train a job spec locally, without any server."),
    "submit": (
        "api.client.commands:submit",
        "Submit a job spec to a server (--watch to follow it).",
    ),
    "watch": (
        "api.client.commands:watch",
        "Follow a job live: progress, loss, loss scale, memory.",
    ),
    "jobs": ("api.client.commands:jobs", "List jobs on a server."),
    "cancel": ("api.client.commands:cancel", "Cancel a job on a server."),
    "logs": ("api.client.commands:logs", "Print a job's lifecycle events."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name][0].split(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import the commands (that would import torch for --help).
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in sorted(COMMANDS)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="amptrain")
def main() -> None:
    """amptrain: declarative PyTorch training jobs with automatic mixed precision."""


if __name__ == "__main__":
    main()
