"""The service's own limits on a job spec, from its settings (see
``amptrain.contract.admission``): which files a user may read, how much memory
and wall-clock time one job may take (against the live workers' memory, too)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis

from amptrain.contract.admission import ServicePolicy, WorkerMemory, admission_problems
from amptrain.contract.catalog import validate_components
from amptrain.contract.spec import JobSpec
from amptrain.core import presence
from amptrain.core.settings import Settings, shape_queue
from amptrain.server.dispatcher import queue_for
from amptrain.server.runtime import Services
from amptrain.server.webhooks import url_problems

log = logging.getLogger(__name__)

GIB = 2**30


def service_policy(settings: Settings, workers: Sequence[WorkerMemory] = ()) -> ServicePolicy:
    """The policy for a job whose queue's live workers report ``workers``."""
    cap = settings.max_job_memory_gib
    return ServicePolicy(
        data_roots=tuple(str(r) for r in settings.data_roots),
        data_protocols=tuple(settings.data_protocols),
        data_roots_per_user=settings.data_roots_per_user,
        weights_roots=tuple(settings.weights_roots),
        max_job_memory_bytes=int(cap * GIB) if cap is not None else None,
        runtime_limit_s=settings.job_runtime_limit_seconds,
        workers=tuple(workers),
        max_nodes=settings.max_nodes,
    )


def queue_workers(client: redis.Redis, queue: str) -> list[WorkerMemory] | None:
    """The memory of ``queue``'s live workers; None when Redis does not answer (then
    nothing is known of them: the workers check again before they allocate, and a Redis
    outage must not refuse jobs)."""
    try:
        return presence.queue_memory(client, queue)
    except redis.RedisError as exc:
        log.warning("workers' memory not checked at submit (Redis: %s)", type(exc).__name__)
        return None


def job_queue(client: redis.Redis, spec: JobSpec) -> str:
    """The queue a new job goes to (:func:`~amptrain.server.dispatcher.queue_for`), knowing
    the machine: a ``device: auto`` job goes to the ``cpu`` queue when the live workers of
    its ``gpu`` queue have no GPU and a worker takes the ``cpu`` one (``amptrain up`` on a
    CPU-only machine: the job trains on the CPU, and "queued on queue gpu" said otherwise).
    With no live worker, or Redis not answering, ``gpu`` as before. A ``devices: N`` job
    whose shape has no worker of either kind yet (``amptrain up`` starts one when such a job
    waits) is judged by the one-device workers: they say what the machine has."""
    gpu = queue_workers(client, shape_queue("gpu", spec.devices))
    cpu = queue_workers(client, shape_queue("cpu", spec.devices))
    if spec.devices > 1 and gpu == [] and cpu == []:
        gpu, cpu = queue_workers(client, "gpu"), queue_workers(client, "cpu")
    cpu_only = gpu is not None and bool(cpu) and not any(w.gpu for w in gpu)
    return queue_for(spec, cpu_only=cpu_only)


def no_worker_notice(queue: str, workers: Sequence[WorkerMemory] | None) -> str | None:
    """What a submitter should know when no live worker takes jobs of ``queue`` (the job
    is queued all the same and starts once one does); None when one does, or unknown."""
    if workers is None or workers:
        return None
    return (
        f"no live worker takes jobs of queue {queue} now: the job waits until one starts "
        f"(a worker started with -Q and --devices-per-job to match)"
    )


def submission_problems(
    spec: JobSpec, owner: str, services: Services, size: int
) -> tuple[list[dict[str, Any]], str, list[WorkerMemory] | None]:
    """What refuses ``spec`` (``size``: its bytes as stored) beyond its own validation, as
    pydantic error dicts: its components' arguments, the service's limits, the spec's size,
    its queue and its alerts' webhook hosts; the queue it goes to (:func:`job_queue`) and
    that queue's live workers (None: unknown). A submit and a fork alike."""
    problems = validate_components(spec)
    queue = job_queue(services.redis, spec)
    workers = queue_workers(services.redis, queue)
    policy = service_policy(services.settings, workers or ())
    problems += admission_problems(spec, owner, policy)
    limit = services.settings.max_spec_bytes
    if size > limit:
        problems.append(
            {
                "loc": (),
                "msg": f"the spec is {size} bytes as JSON; at most {limit} are accepted",
                "type": "too_long",
            }
        )
    queues = services.settings.routable_queues
    if spec.queue is not None and spec.queue not in queues:
        problems.append(
            {
                "loc": ("queue",),
                # The name last: a quote followed by a long text reads as one long value.
                "msg": f"the queues of this service are {', '.join(queues)}"
                f" (shape queues -xN take jobs of devices N), not {spec.queue!r}",
                "type": "enum",
            }
        )
    problems += url_problems(spec.alerts, services.settings, ("alerts",))
    return problems, queue, workers
