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
    "--metrics-port",
    type=int,
    default=9808,
    show_default=True,
    envvar="AMPTRAIN_WORKER_METRICS_PORT",
    help="Prometheus endpoint of this worker (0 disables) [env AMPTRAIN_WORKER_METRICS_PORT].",
)
def worker(
    queues: str, concurrency: int | None, name: str | None, loglevel: str, metrics_port: int
) -> None:
    """Run a Celery worker that trains jobs (configured by AMPTRAIN_* variables)."""
    from worker.main import signals as lifecycle
    from worker.main.celery_app import app

    n = concurrency or max(1, len(lifecycle.visible_gpus()))
    name = name or f"amptrain-{os.getpid()}@{socket.gethostname()}"
    lifecycle.configure(
        queues=[q.strip() for q in queues.split(",") if q.strip()],
        concurrency=n,
        metrics_port=metrics_port,
    )
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
