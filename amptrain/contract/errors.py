"""Why a run stopped. Torch-free, so the worker and API can classify failures.

Each error has a ``code`` (the failure class the service records) and says
whether another attempt could succeed. Messages are written for the user who
submitted the job: what happened, at which step, and what to try.
"""

from __future__ import annotations

import re
from typing import ClassVar

from amptrain.contract.sizing import format_bytes


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


class PrecisionFallbackError(TrainingError):
    """fp16 became unhealthy and ``health.fallback`` names another precision: the attempt
    ends and the job resumes in ``fallback_to`` from its newest healthy checkpoint. Not a failure:
    the retry budget (``max_attempts``) is not charged."""

    code = "precision_fallback"
    retryable = True

    def __init__(
        self, message: str, *, step: int, trigger: str, fallback_to: str, param: str | None = None
    ) -> None:
        super().__init__(message, step=step)
        self.trigger = trigger
        self.fallback_to = fallback_to
        self.param = param
        """The first non-finite gradient's parameter of the newest skipped step, if known."""


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


class TooLargeError(TrainingError):
    """The job's estimated memory exceeds what the device has; another attempt would not fit."""

    code = "too_large"
    retryable = False


class TimeLimitError(TrainingError):
    """The attempt ran past its wall-clock limit (``max_runtime_s``); it checkpointed and stopped."""

    code = "timeout"
    retryable = False


class ResumeMismatchError(TrainingError):
    """The newest checkpoint cannot be resumed exactly: a run with another number of devices
    wrote it (RNG states and data shares are per device), or it is not of the checkpoint
    format this engine writes."""

    code = "resume_mismatch"
    retryable = False


_ALLOCATION_FAILURES = (
    "can't allocate memory",  # CPU: DefaultCPUAllocator
    "DefaultCPUAllocator",
    "CUDA out of memory",
    "out of memory",
)


def classify_failure(exc: BaseException) -> TrainingError:
    """The failure class of an exception that escaped training, for the user to see.

    A :class:`TrainingError` is itself. An allocation failure anywhere (the CPU
    allocator raises a plain ``RuntimeError``; building a model or a dataset can fail
    to allocate before the loop's own OOM handling runs) is ``oom``: retrying the same
    spec on the same kind of worker fails the same way. What torch's deterministic mode
    refuses (``deterministic: true``) is ``invalid_spec`` naming the option and the op
    (:func:`_determinism_failure`). Anything else is ``internal``
    and retryable; its message names only the exception's type, because the text of
    an arbitrary exception can quote file content or paths of the worker (the worker
    logs the traceback instead).
    """
    if isinstance(exc, TrainingError):
        return exc
    text = str(exc)
    if isinstance(exc, RuntimeError) and (refused := _determinism_failure(text)):
        return refused
    if (
        isinstance(exc, MemoryError)
        or type(exc).__name__ == "OutOfMemoryError"
        or (isinstance(exc, RuntimeError) and any(m in text for m in _ALLOCATION_FAILURES))
    ):
        wanted = _requested_bytes(text)
        detail = f" (an allocation of {wanted} failed)" if wanted else ""
        return OutOfMemoryError(
            f"out of memory while setting up or training{detail}: make the model, the "
            "batch or the dataset smaller"
        )
    return TrainingError(
        f"internal error in the training process ({type(exc).__name__}); "
        "the worker's log has the details"
    )


def _requested_bytes(text: str) -> str | None:
    """How much the allocator was asked for, when its message says (sizes, never content)."""
    match = re.search(r"tried to allocate (\d+(?:\.\d+)?)\s*(bytes|[KMGT]iB)?", text)
    if match is None:
        return None
    number, unit = match[1], match[2] or "bytes"
    return format_bytes(int(number)) if unit == "bytes" else f"{number} {unit}"


# torch's own words (aten/src/ATen/Context.cpp), pinned by tests/contract/test_failures.py
# against the installed torch where a CPU can raise them.
_NO_DETERMINISTIC_OP = re.compile(
    r"([\w.:]{1,100}) does not have a deterministic implementation, but you set "
    r"'torch\.use_deterministic_algorithms\(True\)'"
)
_CUBLAS_REFUSED = ("Deterministic behavior was enabled", "CUBLAS_WORKSPACE_CONFIG")


def _determinism_failure(text: str) -> InvalidSpecError | None:
    """The spec's ``deterministic: true`` cannot run as asked: an op with no deterministic
    implementation (its name is torch's, letters, digits, ``_.:`` only: safe to quote), or
    cuBLAS without its workspace setting. Not retryable: another attempt of the same spec
    meets the same op."""
    if match := _NO_DETERMINISTIC_OP.search(text):
        return InvalidSpecError(
            f"deterministic: {match[1]} has no deterministic implementation in PyTorch, so "
            "a deterministic run cannot use it; set deterministic to false, or train a model "
            "without that operation"
        )
    if all(part in text for part in _CUBLAS_REFUSED):
        return InvalidSpecError(
            "deterministic: cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8 in the training "
            "process's environment before its first cuBLAS call (the worker sets it; export "
            "it before `amptrain train`), or set deterministic to false"
        )
    return None
