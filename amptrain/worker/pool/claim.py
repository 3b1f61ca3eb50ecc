"""What a supervisor took when it claimed a job, and what its training child is told: the
launch (spec, checkpoint place, Redis, the owner's data roots) and the wall-clock limit."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amptrain.contract.data_access import PathRefused, user_roots
from amptrain.contract.layout import job_checkpoint_url
from amptrain.core.checkpoint_pins import CheckpointPins
from amptrain.core.settings import Settings
from amptrain.store.models import Job
from amptrain.worker.child.protocol import ForkStart, Launch
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
    fork_of: tuple[str, int] | None = None
    """A fork's parent job and step (:mod:`amptrain.contract.forks`)."""
    unplaced: int = 0
    """Multi-node attempts given back unplaced so far: each adds an attempt to the budget."""
    queue: str = "gpu"
    """The job's queue: where a multi-node job's other nodes are asked to join."""

    @classmethod
    def of_job(cls, job: Job, attempt: int) -> Claim:
        """The claim of ``attempt`` (its claim's fencing token) on the job's row."""
        fork = job.parent_id, job.fork_step
        return cls(
            job.id,
            attempt,
            dict(job.spec),
            job.max_attempts,
            job.owner,
            fallbacks=job.fallbacks,
            precision_override=job.precision_override,
            fork_of=(fork[0], fork[1]) if fork[0] is not None and fork[1] is not None else None,
            unplaced=job.unplaced,
            queue=job.queue,
        )

    def with_fork_step(self, recorded: dict[int, int]) -> dict[int, int]:
        """The resume bound (``recorded``: per attempt, its newest recorded step) of this
        attempt: a fork's steps through its fork step are its parent's recorded history, so
        its own checkpoint of that step (its first, written before any step) is resumable."""
        if self.fork_of is None:
            return recorded
        floor = self.fork_of[1]
        return {a: max(recorded.get(a, 0), floor) for a in range(1, self.attempt)}

    def release_pin(self, settings: Settings) -> None:
        """The job ended: a fork releases its pin on the parent's checkpoint (usually done
        already by its first checkpoint; not when it ended before that)."""
        if self.fork_of is not None:
            parent, step = self.fork_of
            CheckpointPins(settings.checkpoint_url, parent).release(step, self.job_id)

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
        fork=fork_start(settings, claim),
    )


def fork_start(settings: Settings, claim: Claim) -> ForkStart | None:
    """Where a fork's first state is: the parent's directory in the service's checkpoint
    store (the parent's id comes from SQL, never from the user's text)."""
    if claim.fork_of is None:
        return None
    parent, step = claim.fork_of
    return ForkStart(
        parent=parent, step=step, checkpoint_dir=job_checkpoint_url(settings.checkpoint_url, parent)
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
