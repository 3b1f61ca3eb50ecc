"""``amptrain api``, ``amptrain recorder`` and ``amptrain db upgrade|downgrade`` (tokens:
:mod:`amptrain.cli.tokens`)."""

from __future__ import annotations

import logging
import os

import click

from amptrain.core.logs import shown

# Per-connection memory is what limits watchers: measured ~36-42 KiB per WebSocket without
# permessage-deflate and 80-160 KiB with it, so no deflate and small frames. Clients send
# nothing big over WebSockets.
WS_MAX_SIZE = 64 * 1024


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="TCP port.")
@click.option("--log-level", default="info", show_default=True, help="uvicorn's log level.")
@click.option(
    "--quiet", is_flag=True, help="uvicorn's own lines only at warning and above (amptrain up)."
)
def api(host: str, port: int, log_level: str, quiet: bool) -> None:
    """Run the HTTP API (recorder and dispatcher included), configured by AMPTRAIN_*."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    from amptrain.core.logs import configure_logging, quiet_libraries
    from amptrain.core.settings import get_settings
    from amptrain.server.http_guard import (
        ConnectionGuard,
        fit_descriptors,
        guarded,
        guarded_ws,
    )

    settings = get_settings()
    os.umask(0o077)  # the SQLite file, the admin token: readable by this user only
    # One format for our loggers and uvicorn's (log_config=None: uvicorn adds no handlers).
    configure_logging(settings.log_format, component="api", level=log_level)
    if quiet:
        quiet_libraries()
    for name in ("uvicorn.access", "uvicorn.error"):  # WebSocket handshakes log to .error
        logging.getLogger(name).addFilter(strip_query_strings)
    tune_gc()
    # No limit_concurrency: it counts half-open connections and refuses real clients while
    # they last; the guard caps connections at accept, times out unfinished requests and
    # responses their clients do not read.
    guard = ConnectionGuard(
        fit_descriptors(settings.max_connections),
        settings.request_read_timeout_seconds,
        write_timeout_s=settings.response_write_timeout_seconds,
        per_address=settings.max_connections_per_address,
    )
    uvicorn.run(
        "amptrain.server.web.app:create_app",
        factory=True,
        host=host,
        port=port,
        http=guarded(AutoHTTPProtocol, guard),
        # Explicit: left unset, uvicorn believes X-Forwarded-For from 127.0.0.1 (its default),
        # i.e. from any local client, which could then name the address it is throttled as.
        forwarded_allow_ips=settings.forwarded_allow_ips,
        log_level="warning" if quiet else log_level,  # uvicorn sets its loggers' level to it
        log_config=None,
        ws=guarded_ws(WebSocketsSansIOProtocol, guard),
        ws_per_message_deflate=False,
        ws_max_size=WS_MAX_SIZE,
        ws_max_queue=16,
        timeout_graceful_shutdown=15,
    )


@click.command()
@click.option(
    "--metrics-port",
    default=0,
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics (the recorder's throughput and lag) on this port; 0: off.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Interface of the recorder's Prometheus endpoint.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"], case_sensitive=False),
    help="The recorder's log level.",
)
def recorder(metrics_port: int, metrics_host: str, log_level: str) -> None:
    """Record telemetry from Redis into SQL in a process of its own, until SIGTERM.

    For a busy service: set AMPTRAIN_RECORDER_IN_API=false on the API processes and run
    one or more of these beside them (each job is recorded by one recorder at a time).
    """
    import signal
    import threading

    from amptrain.core.logs import configure_logging
    from amptrain.core.settings import get_settings
    from amptrain.server.recorder.process import run_recorder

    settings = get_settings()
    configure_logging(settings.log_format, component="recorder", level=log_level.upper())
    tune_gc("amptrain.server.recorder.process")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if metrics_port:
        from prometheus_client import start_http_server

        try:
            start_http_server(metrics_port, addr=metrics_host)
        except OSError as exc:  # taken port, unknown host: say which, not a traceback
            raise click.ClickException(
                f"cannot serve metrics on {metrics_host}:{metrics_port}: {exc}"
            ) from exc
    try:
        run_recorder(settings, stop)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc


def strip_query_strings(record: logging.LogRecord) -> bool:
    """Access-log filter: paths without their query strings (cursors, filters and anything
    a client put in a URL stay out of the logs), and every other value escaped (the client
    address is a proxy's X-Forwarded-For as sent, when one is trusted)."""
    if isinstance(record.args, tuple):
        record.args = tuple(
            (arg.partition("?")[0] if arg.startswith("/") else shown(arg))
            if isinstance(arg, str)
            else arg
            for arg in record.args
        )
    return True


def tune_gc(preload: str = "amptrain.server.web.app") -> None:
    """Fewer, cheaper garbage collections in a server process: the API (its live fan-out
    and its recorder thread) and ``amptrain recorder``. ``preload``: the module whose
    objects are frozen with the rest (imported now).

    Measured with bench/stream_latency.py (500 WebSocket watchers, 100 steps/s): with
    CPython's defaults the collector's pauses made p99 latency 191 ms; with the
    start-up objects frozen out of every scan and young collections 70x rarer it is
    40-55 ms. bench/recorder_throughput.py --parts --untuned-gc: the collector took about
    3.4 us of the recorder's CPU per step point with the defaults, which a recorder of its
    own process paid until it was tuned too. Memory grows by at most the young
    generation's 50,000 objects.
    """
    import gc
    import importlib

    importlib.import_module(preload)
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
    from amptrain.core.settings import get_settings
    from amptrain.store import migrate

    settings = get_settings()
    os.umask(0o077)
    _ensure_sqlite_dir(settings.database_url)
    migrate.upgrade(settings.database_url, revision)
    click.echo(f"database at {migrate.current_revision(settings.database_url)}")


@db.command()
@click.argument("revision")
def downgrade(revision: str) -> None:
    """Migrate the database down to REVISION (``base`` removes every table)."""
    from amptrain.core.settings import get_settings
    from amptrain.store import migrate

    settings = get_settings()
    migrate.downgrade(settings.database_url, revision)
    click.echo(f"database at {migrate.current_revision(settings.database_url) or 'base'}")


def _ensure_sqlite_dir(url: str) -> None:
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        from pathlib import Path

        Path(parsed.database).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
