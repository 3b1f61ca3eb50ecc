"""``amptrain worker``: a Celery worker with one prefork process per visible GPU."""

from __future__ import annotations

import os
import socket
import warnings

import click

from amptrain.contract.spec import MAX_DEVICES

MAX_CONCURRENCY = 64
"""Most jobs one worker trains at once (each in a pool process and a child of its own)."""


@click.command()
@click.option(
    "--queues", "-Q", default="gpu,cpu", show_default=True, help="Queues to take jobs from."
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, MAX_CONCURRENCY),
    default=None,
    help="Jobs at once [default: visible GPUs / devices per job, at least 1].",
)
@click.option(
    "--devices-per-job",
    "-K",
    type=click.IntRange(1, MAX_DEVICES),
    default=1,
    show_default=True,
    envvar="AMPTRAIN_WORKER_DEVICES_PER_JOB",
    help="Devices each job trains on: pool process i owns GPUs [i*K, (i+1)*K) and takes jobs "
    "of devices K only, from the shape queue of each -Q queue (gpu-xK, cpu-xK; K 1: gpu, cpu) "
    "[env AMPTRAIN_WORKER_DEVICES_PER_JOB].",
)
@click.option("--name", "-n", default=None, help="Worker name [default: amptrain-PID@HOST].")
@click.option("--loglevel", "-l", default="INFO", show_default=True, help="Celery's log level.")
@click.option(
    "--quiet",
    is_flag=True,
    help="amptrain's lines only: no Celery banner, Celery's own lines at WARNING and above "
    "(amptrain up without --verbose).",
)
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
    devices_per_job: int,
    name: str | None,
    loglevel: str,
    quiet: bool,
    metrics_host: str,
    metrics_port: int,
) -> None:
    """Run a Celery worker that trains jobs (configured by AMPTRAIN_* variables)."""
    from celery.exceptions import SecurityWarning

    from amptrain.core.settings import get_settings
    from amptrain.worker.main import devices
    from amptrain.worker.main.celery_app import app
    from amptrain.worker.main.signals import WorkerLifecycle, WorkerOptions

    # Asked here, before Celery forks: every pool process inherits the report (its GPUs,
    # and the CPU's bf16 measurement that every job's `precision: auto` then uses).
    devices.report()
    gpus = devices.visible_gpus()
    consumed = shaped_queues([q.strip() for q in queues.split(",") if q.strip()], devices_per_job)
    n = default_concurrency(gpus, devices_per_job)  # raises when a job's GPUs are not there
    n = concurrency or n
    devices.set_devices_per_job(devices_per_job)  # before the fork: pool processes inherit it
    name = name or f"amptrain-{os.getpid()}@{socket.gethostname()}"
    options = WorkerOptions(
        queues=consumed,
        concurrency=n,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        devices_per_job=devices_per_job,
        quiet=quiet,
        slot_gpus=[list(devices.slot_gpus(i, gpus, devices_per_job)) for i in range(n)],
    )
    WorkerLifecycle(options, get_settings()).connect()
    # Celery's 8-line advice to run as another user is not one a container (where root is
    # the norm) can act on: the worker says it in one line when ready (WorkerLifecycle).
    warnings.filterwarnings("ignore", category=SecurityWarning)
    app.worker_main(
        [
            *(["--quiet"] if quiet else []),  # celery's own option: no ASCII banner
            "worker",
            "--pool=prefork",  # solo cannot terminate a task and loses broker heartbeats
            f"--concurrency={n}",
            f"--queues={','.join(consumed)}",
            f"--hostname={name}",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
    )


def shaped_queues(queues: list[str], per_job: int) -> list[str]:
    """The queues a worker taking ``per_job``-device jobs consumes: the shape queue of each
    ``-Q`` queue (``gpu`` -> ``gpu-x2``), the queues themselves for one device."""
    from amptrain.core.settings import QUEUE_NAME, shape_queue

    shaped = [shape_queue(q, per_job) for q in queues]
    for q in shaped:
        if not QUEUE_NAME.match(q):
            raise click.BadParameter(
                f"queue {q!r} is not a valid queue name (at most 16 characters)", param_hint="-Q"
            )
    return shaped


def default_concurrency(gpus: tuple[str, ...], per_job: int) -> int:
    """One pool process per block of ``per_job`` visible GPUs (at least one: a worker
    without GPUs runs its jobs on the CPU). Fewer GPUs than one job needs is an error:
    two ranks on one GPU is not data parallelism (NCCL refuses it)."""
    if 0 < len(gpus) < per_job:
        raise click.BadParameter(
            f"{per_job} devices per job, but this worker sees {len(gpus)} GPU(s): "
            f"{', '.join(gpus)}",
            param_hint="--devices-per-job",
        )
    return max(1, len(gpus) // per_job)
