"""How an exception that escaped training is shown to the user: allocation failures are
``oom`` (not retried), anything else ``internal`` without the exception's text."""

from __future__ import annotations

import pytest
import torch

from amptrain.contract.errors import InvalidSpecError, classify_failure


def _raised(fn: object) -> BaseException:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def test_a_real_cpu_allocation_failure_is_oom_and_not_retried() -> None:
    exc = _raised(lambda: torch.empty(2**50, dtype=torch.uint8))  # 1 PiB
    assert type(exc) is RuntimeError and "DefaultCPUAllocator" in str(exc)
    error = classify_failure(exc)
    assert (error.code, error.retryable) == ("oom", False)
    assert "1024.0 TiB" in error.message


def test_memory_error_and_torch_out_of_memory_are_oom() -> None:
    assert classify_failure(MemoryError()).code == "oom"
    assert classify_failure(torch.OutOfMemoryError("CUDA out of memory. Tried")).code == "oom"


def test_other_exceptions_are_internal_without_their_text() -> None:
    secret = ValueError("could not convert string 'TOP-SECRET-42' to float64 in /home/w/run")
    error = classify_failure(secret)
    assert (error.code, error.retryable) == ("internal", True)
    assert "TOP-SECRET" not in error.message and "/home" not in error.message
    assert "ValueError" in error.message and "worker's log" in error.message


def test_training_errors_keep_their_own_class() -> None:
    exc = InvalidSpecError("dataset.args.path: nope", step=3)
    assert classify_failure(exc) is exc


@pytest.mark.parametrize("text", ["something else entirely", "index out of range"])
def test_runtime_errors_that_are_not_allocations_stay_internal(text: str) -> None:
    assert classify_failure(RuntimeError(text)).code == "internal"
