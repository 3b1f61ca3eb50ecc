"""How an attempt ended, as the job's next state: succeeded, cancelled, re-queued (a
preemption, or a retryable failure with attempts left) or failed, with its error."""

from __future__ import annotations

import logging
import signal
from typing import Any

from amptrain.contract.errors import TimeLimitError
from amptrain.contract.text import quote
from amptrain.core.enums import JobStatus
from amptrain.worker.child.protocol import Failed
from amptrain.worker.pool.claim import Claim
from amptrain.worker.pool.watch import Outcome

log = logging.getLogger(__name__)


def final_state(
    claim: Claim, out: Outcome, runtime_limit_s: float
) -> tuple[JobStatus, dict[str, Any] | None]:
    """The job's state after this attempt, and the error to record (None: none)."""
    if out.result is not None:
        return JobStatus.SUCCEEDED, None
    if out.stop_requested == "cancel":
        return JobStatus.CANCELLED, None
    if out.stop_requested == "preempt" or _drained_elsewhere(claim, out):
        return JobStatus.QUEUED, None
    if out.stop_requested == "timeout":
        return JobStatus.FAILED, timed_out(out, runtime_limit_s)
    failure = out.failure or _no_result(claim, out)
    if failure.fallback_to is not None:  # not a failure: the budget is not charged
        log.info("job %s falls back to %s; re-queueing", claim.job_id, failure.fallback_to)
        return JobStatus.QUEUED, failure.error()
    if failure.retryable and claim.attempts_left:
        log.warning(
            "job %s attempt %d failed (%s); re-queueing", claim.job_id, claim.attempt, failure.code
        )
        return JobStatus.QUEUED, failure.error()
    return JobStatus.FAILED, failure.error()


def _drained_elsewhere(claim: Claim, out: Outcome) -> bool:
    """Another node of a multi-node attempt drained: every node checkpointed at one step on
    the ranks' agreement, as when this one drains (back to the queue, nothing charged)."""
    return claim.nodes > 1 and out.failure is not None and out.failure.code == "preempted"


def timed_out(out: Outcome, runtime_limit_s: float) -> dict[str, Any]:
    """The ``timeout`` error of an attempt stopped at its wall-clock limit."""
    step = out.failure.step if out.failure else None
    where = f"; checkpointed at step {step}" if step is not None else ""
    error = TimeLimitError(
        f"stopped after {runtime_limit_s:g} s, the wall-clock limit of one attempt "
        f"(max_runtime_s){where}",
        step=step,
    )
    return error.to_dict()


def _no_result(claim: Claim, out: Outcome) -> Failed:
    """Why a child that sent no error ended: a bus error is the kernel refusing a page of a
    memory-mapped file that is no longer there. The only files a training child maps are
    its dataset's (uncompressed ``.npz`` members and ``.pt`` archives), so the file was
    truncated or replaced under it; a retry would train on other data, or fail the same."""
    if out.exit_code == -signal.SIGBUS:
        dataset = claim.spec.get("dataset")
        args = dataset.get("args", {}) if isinstance(dataset, dict) else {}
        files = [
            f"dataset.args.{key} {quote(str(args[key]), 120)}"
            for key in ("path", "val_path")
            if isinstance(args, dict) and args.get(key)
        ]
        named = f" ({' or '.join(files)})" if files else ""
        return Failed(
            code="invalid_spec",
            message=(
                "the training process was killed by SIGBUS: a memory-mapped data file"
                f"{named} was truncated or changed while the job read it; keep a job's "
                "data files unchanged until it ends (write a new file, then rename it)"
            ),
            step=None,
            retryable=False,
        )
    return Failed(
        code="internal",
        message=f"training process exited with code {out.exit_code} without a result",
        step=None,
        retryable=True,
    )
