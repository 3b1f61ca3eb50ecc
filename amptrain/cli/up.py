"""``amptrain up``: the whole service on one machine, with no setup.

A private Redis (unless ``AMPTRAIN_REDIS_URL`` names one), SQLite in the data
directory (unless ``AMPTRAIN_DATABASE_URL``), migrations, one worker (and one per
multi-device job shape a waiting job needs, :mod:`amptrain.cli.up_shapes`), the recorder and the
API, each a child process in a process group of its own (the terminal's Ctrl-C reaches
only ``up``) that dies with ``up`` however ``up`` dies (a parent-death signal). Ctrl-C
or SIGTERM stops them in order, within ``AMPTRAIN_STOP_TIMEOUT_SECONDS``; a second
Ctrl-C stops them at once (:mod:`amptrain.cli.up_stop`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.cli.guide import GuideBuild
from amptrain.cli.up_shapes import ShapeWorkers
from amptrain.cli.up_stop import WORKER_PART, Stopper, say
from amptrain.cli.worker_ready import WorkerReady
from amptrain.contract.local_server import client_url, remove_record, write_record
from amptrain.core.lifeline import DieWithSpawner
from amptrain.core.settings import GUIDE_DIR, Settings
from amptrain.store.db import make_engine, make_session_factory
from amptrain.worker.main.cli import MAX_CONCURRENCY
from amptrain.worker.main.devices import visible_gpus


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Own process group: Ctrl-C reaches only `up`, which stops the children in order.
    return subprocess.Popen(
        [sys.executable, "-m", "amptrain.cli.main", *args],
        env=env,
        start_new_session=True,
        preexec_fn=DieWithSpawner(),  # `up` has no threads: safe between fork and exec
    )


def make_private(data_dir: Path) -> None:
    """Everything this process and its children create is theirs alone (umask 077: the
    SQLite file, Redis' append-only file, checkpoints, the admin token), and the data
    directory itself is 0700 even when it existed before."""
    os.umask(0o077)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)


def up_settings(data_dir: Path | None) -> Settings:
    """The environment's settings, with ``--data-dir`` applied and text logs unless
    ``AMPTRAIN_LOG_FORMAT`` chose otherwise."""
    settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
    if "log_format" not in settings.model_fields_set:
        settings = settings.model_copy(update={"log_format": "text"})
    return settings


def child_env(settings: Settings) -> dict[str, str]:
    """What the worker and the API run with: this environment plus what `up` decided."""
    return {
        **os.environ,
        "AMPTRAIN_DATA_DIR": str(settings.data_dir),
        "AMPTRAIN_DATABASE_URL": settings.database_url,
        "AMPTRAIN_REDIS_URL": settings.redis_url,
        "AMPTRAIN_LOG_FORMAT": settings.log_format,
    }


def _prepare(settings: Settings) -> bool:
    """Migrate the database and make sure an admin token exists (printed if new)."""
    from amptrain.server.runtime import ensure_admin_token
    from amptrain.store import migrate

    migrate.upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        return ensure_admin_token(settings, make_session_factory(engine), reveal=True)
    finally:
        engine.dispose()


@click.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Interface the API listens on."
)
@click.option("--port", default=8000, show_default=True, type=int, help="The API's TCP port.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="[default: $AMPTRAIN_DATA_DIR or ./.amptrain]",
)
@click.option(
    "--slots",
    type=click.IntRange(1, MAX_CONCURRENCY),
    default=None,
    help="Jobs the worker trains at once [default: one per visible GPU, else 1].",
)
@click.option(
    "--worker-metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="The worker's Prometheus port, 0 for none [default: $AMPTRAIN_WORKER_METRICS_PORT "
    "or 9808].",
)
@click.option(
    "--guide/--no-guide",
    default=True,
    show_default=True,
    help="Build (once, when its sources changed) and serve the documentation site at /guide/.",
)
@click.option(
    "--verbose", is_flag=True, help="Also Celery's banner and Celery's and uvicorn's info lines."
)
def up(
    host: str,
    port: int,
    data_dir: Path | None,
    slots: int | None,
    worker_metrics_port: int | None,
    guide: bool,
    verbose: bool,
) -> None:
    """Run everything on this machine: Redis, database, one worker, the recorder, the API."""
    settings = up_settings(data_dir)
    make_private(settings.data_dir)
    redis_server = None
    if settings.wants_embedded_redis:
        redis_server = EmbeddedRedis(settings.embedded_redis_dir).start()
    try:
        new_token = _prepare(settings)
    except BaseException:
        if redis_server is not None:
            redis_server.stop()
        raise

    env = child_env(settings)
    # The terminal shows amptrain's lines; the libraries' own info lines with --verbose.
    quiet = [] if verbose else ["--quiet"]
    worker = ["worker", "--queues", ",".join(settings.queues), *quiet]
    if slots is not None:
        worker += ["--concurrency", str(slots)]
    if worker_metrics_port is not None:
        worker += ["--metrics-port", str(worker_metrics_port)]
    # One machine, one worker for one-device jobs: it serves every queue a job may name
    # here; the workers of multi-device jobs start when such a job waits (ShapeWorkers).
    parts = {WORKER_PART: _spawn(worker, env)}
    if "AMPTRAIN_RECORDER_IN_API" not in os.environ:
        # The recorder in a process of its own: on a busy machine the API then answers
        # about twice as fast (bench/load.py --recorder process). An operator's
        # AMPTRAIN_RECORDER_IN_API keeps it in the API.
        env["AMPTRAIN_RECORDER_IN_API"] = "false"
        parts["recorder"] = _spawn(["recorder"], env)
    parts["api"] = _spawn(["api", "--host", host, "--port", str(port), *quiet], env)
    # The command-line client finds this server by this record (while `up` lives).
    url = client_url(host, port)
    write_record(settings.data_dir, url, os.getpid())
    # "Up" once the worker takes jobs: a job submitted before would find no live worker,
    # be routed as if the machine had a GPU ("queued on queue gpu") and wait.
    click.echo(f"amptrain is starting at {url}/ui/ (its worker comes up next)")
    ready = WorkerReady(settings.redis_url, settings.queues[0])
    if not new_token:
        click.echo(f"admin token: see {settings.admin_token_file} or AMPTRAIN_ADMIN_TOKEN")
    docs = GuideBuild(settings.data_dir / GUIDE_DIR, f"{url}/guide/")
    if guide:
        click.echo(docs.start())

    stopper = Stopper(parts, redis_server, settings.redis_url, settings.stop_timeout_seconds)
    engine = make_engine(settings.database_url)
    shapes = ShapeWorkers(
        make_session_factory(engine),
        tuple(settings.queues),
        lambda args: _spawn([*args, *quiet], env),
        parts,
        gpus=lambda: len(visible_gpus()),
    )

    def tick() -> None:
        shapes.poll()
        docs.poll()
        if ready.first_time():
            click.echo(f"amptrain is up at {url}/ui/  (data in {settings.data_dir})")

    try:
        crashed = _run_until_stopped(parts, tick)
    finally:
        engine.dispose()
        ready.close()
        docs.stop()
        remove_record(settings.data_dir, os.getpid())
    orderly = stopper.stop()
    sys.exit(0 if orderly and not crashed else 1)


def _run_until_stopped(parts: dict[str, subprocess.Popen[bytes]], tick: Callable[[], None]) -> bool:
    """Until Ctrl-C or SIGTERM (False) or until a part exits on its own (True); ``tick``
    runs between the looks at the parts."""

    def _on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Explicitly: a shell that starts us in the background leaves SIGINT ignored.
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    try:
        while all(proc.poll() is None for proc in list(parts.values())):
            tick()
            time.sleep(0.5)
    except KeyboardInterrupt:
        return False
    gone = [name for name, proc in parts.items() if proc.poll() is not None]
    say(f"{', '.join(gone)} exited; shutting down")
    return True
