"""The service's own limits on a job spec, from its settings (see
``amptrain.contract.admission``): which files a user may read, how much memory
and wall-clock time one job may take."""

from __future__ import annotations

from amptrain.contract.admission import ServicePolicy
from amptrain.core.settings import Settings

GIB = 2**30


def service_policy(settings: Settings) -> ServicePolicy:
    return ServicePolicy(
        data_roots=tuple(str(r) for r in settings.data_roots),
        data_protocols=tuple(settings.data_protocols),
        data_roots_per_user=settings.data_roots_per_user,
        max_job_memory_bytes=int(settings.max_job_memory_gib * GIB),
        runtime_limit_s=settings.job_runtime_limit_seconds,
    )
