"""Why a run stopped. Torch-free, so the worker and API can classify failures.

Each error has a ``code`` (the failure class the service records) and says
whether another attempt could succeed. Messages are written for the user who
submitted the job: what happened, at which step, and what to try.
"""

from __future__ import annotations

from typing import ClassVar


class TrainingError(Exception):
    """Base class: a run that cannot continue."""

    code: ClassVar[str] = "internal"
    retryable: ClassVar[bool] = True

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.step = step

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "step": self.step}


class InvalidSpecError(TrainingError):
    """The spec cannot run here: unknown component, bad arguments, unsupported precision."""

    code = "invalid_spec"
    retryable = False


class DivergedError(TrainingError):
    """Loss went non-finite (bf16/fp32) or the fp16 loss scale collapsed."""

    code = "diverged"
    retryable = False


class OutOfMemoryError(TrainingError):
    """The device ran out of memory and the micro-batch could not shrink further."""

    code = "oom"
    retryable = False


class CancelledError(TrainingError):
    """The caller asked the run to stop."""

    code = "cancelled"
    retryable = False


class PreemptedError(TrainingError):
    """The run was asked to stop for a shutdown; it checkpointed and can be resumed."""

    code = "preempted"
    retryable = True
