"""``amptrain worker``: a Celery worker with one prefork process per visible GPU."""

from __future__ import annotations

import os
import socket

import click


@click.command()
@click.option(
    "--queues", "-Q", default="gpu,cpu", show_default=True, help="Queues to take jobs from."
)
@click.option(
    "--concurrency",
    "-c",
    type=int,
    default=None,
    help="Jobs at once [default: visible GPUs, at least 1].",
)
@click.option("--name", "-n", default=None, help="Worker name [default: amptrain-PID@HOST].")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="AMPTRAIN_WORKER_METRICS_HOST",
    help="Address the Prometheus endpoint listens on; it has no authentication, so "
    "listen beyond this machine only where the network is trusted "
    "[env AMPTRAIN_WORKER_METRICS_HOST].",
)
@click.option(
    "--metrics-port",
    type=int,
    default=9808,
    show_default=True,
    envvar="AMPTRAIN_WORKER_METRICS_PORT",
    help="Prometheus endpoint of this worker (0 disables) [env AMPTRAIN_WORKER_METRICS_PORT].",
)
def worker(
    queues: str,
    concurrency: int | None,
    name: str | None,
    loglevel: str,
    metrics_host: str,
    metrics_port: int,
) -> None:
    """Run a Celery worker that trains jobs (configured by AMPTRAIN_* variables)."""
    from api.core.settings import get_settings
    from worker.main import devices
    from worker.main.celery_app import app
    from worker.main.signals import WorkerLifecycle, WorkerOptions

    # Asked here, before Celery forks: every pool process inherits the report (its GPUs,
    # and the CPU's bf16 measurement that every job's `precision: auto` then uses).
    devices.report()
    gpus = devices.visible_gpus()
    n = concurrency or max(1, len(gpus))
    name = name or f"amptrain-{os.getpid()}@{socket.gethostname()}"
    options = WorkerOptions(
        queues=[q.strip() for q in queues.split(",") if q.strip()],
        concurrency=n,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
    )
    WorkerLifecycle(options, get_settings()).connect()
    app.worker_main(
        [
            "worker",
            "--pool=prefork",  # solo cannot terminate a task and loses broker heartbeats
            f"--concurrency={n}",
            f"--queues={queues}",
            f"--hostname={name}",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
