"""``amptrain token create|list|revoke``: API tokens, straight in the database.

Tokens are stored hashed, so ``create`` prints the plaintext once and ``list`` shows
everything but the token itself. A revoked or expired token is refused with 401 at
once, also by open WebSocket/SSE streams at their next message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@contextmanager
def _session() -> Iterator[Session]:
    """A session on the configured database, committed when the block succeeds."""
    from amptrain.core.settings import get_settings
    from amptrain.store.db import make_engine, make_session_factory

    engine = make_engine(get_settings().database_url)
    try:
        with make_session_factory(engine).begin() as s:
            yield s
    finally:
        engine.dispose()


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> timedelta | None:
    if value is None:
        return None
    from amptrain.store.tokens import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group()
def token() -> None:
    """Create, list and revoke API tokens (AMPTRAIN_DATABASE_URL)."""


@token.command("create")
@click.argument("name")
@click.option("--admin", is_flag=True, help="May see and cancel every user's jobs.")
@click.option(
    "--expires",
    callback=_duration,
    metavar="DURATION",
    help="Refuse the token after this long: 30d, 12h, 90m, 2w, 45s [default: never].",
)
def create(name: str, admin: bool, expires: timedelta | None) -> None:
    """Create a token called NAME and print it (it is stored hashed: shown only now)."""
    from amptrain.store import tokens

    if not name.strip() or len(name) > 200 or not name.isprintable():
        raise click.BadParameter("1 to 200 printable characters", param_hint="NAME")
    try:
        with _session() as s:
            plaintext = tokens.create_token(s, name, is_admin=admin, expires_in=expires)
    except tokens.TokenNameTaken as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(plaintext)


@token.command("list")
def list_() -> None:
    """Every token: name, role, state (active, expired, revoked), created and expiry times."""
    from amptrain.store import tokens
    from amptrain.store.models import utcnow

    now = utcnow()
    with _session() as s:
        rows = [
            (
                row.name,
                "admin" if row.is_admin else "user",
                _state(row.revoked_at, row.expires_at, now),
                _when(row.created_at),
                _when(row.expires_at) if row.expires_at else "never",
            )
            for row in tokens.list_tokens(s)
        ]
    header = ("NAME", "ROLE", "STATE", "CREATED", "EXPIRES")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@token.command("revoke")
@click.argument("name")
def revoke(name: str) -> None:
    """Revoke the token called NAME: every request with it gets 401 from now on."""
    from amptrain.store import tokens

    try:
        with _session() as s:
            row = tokens.revoke_token(s, name)
            when = _when(row.revoked_at)
    except tokens.TokenNotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"revoked {name} at {when}")


def _state(revoked_at: datetime | None, expires_at: datetime | None, now: datetime) -> str:
    if revoked_at is not None:
        return "revoked"
    if expires_at is not None and expires_at <= now:
        return "expired"
    return "active"


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%SZ") if at else "-"
