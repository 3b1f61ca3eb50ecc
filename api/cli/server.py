"""``amptrain api``, ``amptrain db upgrade|downgrade`` and ``amptrain token create``."""

from __future__ import annotations

import click

# Per-connection memory is what limits watchers: measured ~36-42 KiB per WebSocket without
# permessage-deflate and 80-160 KiB with it, so no deflate and small frames. Clients send
# nothing big over WebSockets.
WS_MAX_SIZE = 64 * 1024


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="TCP port.")
@click.option("--log-level", default="info", show_default=True)
def api(host: str, port: int, log_level: str) -> None:
    """Run the HTTP API (recorder and dispatcher included), configured by AMPTRAIN_*."""
    import uvicorn

    from api.core.logs import configure_logging
    from api.core.settings import get_settings

    # One format for our loggers and uvicorn's (log_config=None: uvicorn adds no handlers).
    configure_logging(get_settings().log_format, component="api", level=log_level)
    _tune_gc()
    uvicorn.run(
        "api.web.app:create_app",
        factory=True,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_max_size=WS_MAX_SIZE,
        ws_max_queue=16,
        timeout_graceful_shutdown=15,
    )


def _tune_gc() -> None:
    """Fewer, cheaper garbage collections for the live fan-out.

    Measured with bench/stream_latency.py (500 WebSocket watchers, 100 steps/s): with
    CPython's defaults the collector's pauses made p99 latency 191 ms; with the
    start-up objects frozen out of every scan and young collections 70x rarer it is
    40-55 ms. Memory grows by at most the young generation's 50,000 objects.
    """
    import gc

    import api.web.app  # noqa: F401  (imported now so its objects are frozen with the rest)

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


@click.group()
def db() -> None:
    """Database migrations (AMPTRAIN_DATABASE_URL, default SQLite in the data directory)."""


@db.command()
@click.argument("revision", default="head")
def upgrade(revision: str) -> None:
    """Migrate the database up to REVISION (default: the newest)."""
    from api.core.settings import get_settings
    from api.store import migrate

    settings = get_settings()
    _ensure_sqlite_dir(settings.database_url)
    migrate.upgrade(settings.database_url, revision)
    click.echo(f"database at {migrate.current_revision(settings.database_url)}")


@db.command()
@click.argument("revision")
def downgrade(revision: str) -> None:
    """Migrate the database down to REVISION (``base`` removes every table)."""
    from api.core.settings import get_settings
    from api.store import migrate

    settings = get_settings()
    migrate.downgrade(settings.database_url, revision)
    click.echo(f"database at {migrate.current_revision(settings.database_url) or 'base'}")


@click.group()
def token() -> None:
    """Manage API tokens."""


@token.command("create")
@click.argument("name")
@click.option("--admin", is_flag=True, help="May see and cancel every user's jobs.")
def create(name: str, admin: bool) -> None:
    """Create a token called NAME and print it (it is stored hashed: shown only now)."""
    from api.core.settings import get_settings
    from api.store import tokens
    from api.store.db import make_engine, make_session_factory

    engine = make_engine(get_settings().database_url)
    try:
        with make_session_factory(engine)() as s:
            try:
                plaintext = tokens.create_token(s, name, is_admin=admin)
            except tokens.TokenNameTaken as exc:
                raise click.ClickException(str(exc)) from None
            s.commit()
    finally:
        engine.dispose()
    click.echo(plaintext)


def _ensure_sqlite_dir(url: str) -> None:
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        from pathlib import Path

        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
