"""What a supervisor took when it claimed a job, and what its training child is told: the
launch (spec, checkpoint place, Redis, the owner's data roots) and the wall-clock limit."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amptrain.contract.data_access import PathRefused, user_roots
from amptrain.contract.layout import job_checkpoint_url
from amptrain.core.settings import Settings
from amptrain.worker.child.protocol import Launch
from amptrain.worker.main import devices

log = logging.getLogger(__name__)

PRECISION_CACHE = "auto-precision.json"
"""In the worker's data directory: ``precision: auto`` decisions that outlive each attempt's
process (:mod:`amptrain.worker.child.precision_cache`)."""


@dataclass(frozen=True)
class Claim:
    """The attempt this supervisor took, and what it needs of the job."""

    job_id: str
    attempt: int
    spec: dict[str, Any]
    max_attempts: int
    owner: str
    fallbacks: int = 0
    """Precision fallbacks so far: each adds an attempt to the retry budget."""
    precision_override: str | None = None
    """After a fallback: the precision this attempt trains in instead of the spec's."""
    unplaced: int = 0
    """Multi-node attempts given back unplaced so far: each adds an attempt to the budget."""
    queue: str = "gpu"
    """The job's queue: where a multi-node job's other nodes are asked to join."""

    @property
    def nodes(self) -> int:
        value = self.spec.get("nodes", 1)
        return value if isinstance(value, int) and value > 1 else 1

    @property
    def attempts_left(self) -> bool:
        """Another attempt is within the retry budget (``max_attempts`` + fallbacks +
        unplaced)."""
        return self.attempt < self.max_attempts + self.fallbacks + self.unplaced


def launch(settings: Settings, claim: Claim, recorded: dict[int, int] | None = None) -> Launch:
    """What the training child of this attempt is told; ``recorded``: see
    :mod:`amptrain.worker.pool.resume_bound`."""
    return Launch(
        job_id=claim.job_id,
        attempt=claim.attempt,
        spec=claim.spec,
        checkpoint_dir=job_checkpoint_url(settings.checkpoint_url, claim.job_id),
        redis_url=settings.redis_url,
        data_roots=data_roots(settings, claim),
        weights_roots=data_roots(settings, claim, settings.weights_roots),
        recorded=recorded,
        cpu_bf16_probe=devices.cpu_bf16_probe(devices.known_report()),
        precision_cache=str(settings.data_dir / PRECISION_CACHE),
        precision_override=claim.precision_override,
    )


def data_roots(
    settings: Settings, claim: Claim, configured: Sequence[str] | None = None
) -> list[str]:
    """The data roots (or ``configured`` ones: the weights roots) this job's owner may read
    (``ROOT/<owner>`` with per-user roots)."""
    roots = [str(r) for r in (settings.data_roots if configured is None else configured)]
    try:
        return user_roots(roots, claim.owner, settings.data_roots_per_user)
    except PathRefused:
        log.warning("job %s: owner %r cannot have data roots", claim.job_id, claim.owner)
        return []


def runtime_limit(settings: Settings, claim: Claim) -> float:
    """The attempt's wall-clock limit: the spec's ``max_runtime_s`` (or the default),
    never above the service's limit."""
    asked = claim.spec.get("max_runtime_s") or settings.job_runtime_default_seconds
    return float(min(asked, settings.job_runtime_limit_seconds))
