"""The service's own limits on a job spec, from its settings (see
``amptrain.contract.admission``): which files a user may read, how much memory
and wall-clock time one job may take (against the live workers' memory, too)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from amptrain.contract.admission import ServicePolicy, WorkerMemory
from amptrain.core import presence
from amptrain.core.settings import Settings

log = logging.getLogger(__name__)

GIB = 2**30


def service_policy(settings: Settings, workers: Sequence[WorkerMemory] = ()) -> ServicePolicy:
    """The policy for a job whose queue's live workers report ``workers``."""
    cap = settings.max_job_memory_gib
    return ServicePolicy(
        data_roots=tuple(str(r) for r in settings.data_roots),
        data_protocols=tuple(settings.data_protocols),
        data_roots_per_user=settings.data_roots_per_user,
        max_job_memory_bytes=int(cap * GIB) if cap is not None else None,
        runtime_limit_s=settings.job_runtime_limit_seconds,
        workers=tuple(workers),
    )


def queue_workers(client: redis.Redis, queue: str) -> list[WorkerMemory]:
    """The memory of ``queue``'s live workers; none when Redis does not answer (the
    workers check again before they allocate: a Redis outage must not refuse jobs)."""
    try:
        return presence.queue_memory(client, queue)
    except redis.RedisError as exc:
        log.warning("workers' memory not checked at submit (Redis: %s)", type(exc).__name__)
        return []
