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


def test_an_op_deterministic_mode_refuses_is_invalid_spec_naming_the_option_and_the_op() -> None:
    # torch's own words, from the installed torch: Tensor.put_ has no deterministic kernel.
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        exc = _raised(lambda: torch.zeros(2).put_(torch.tensor([0]), torch.ones(1)))
    finally:
        torch.use_deterministic_algorithms(saved)
    error = classify_failure(exc)
    assert (error.code, error.retryable) == ("invalid_spec", False)
    assert error.message.startswith("deterministic: put_ has no deterministic implementation")
    assert "set deterministic to false" in error.message


def test_cublas_without_its_workspace_setting_is_invalid_spec_naming_the_variable() -> None:
    # What torch raises at the first cuBLAS call of a deterministic process without the
    # variable (aten/src/ATen/Context.cpp; a CPU cannot raise it).
    text = (
        "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)`"
        " or `at::Context::setDeterministicAlgorithms(true)`, but this operation is not "
        "deterministic because it uses CuBLAS and you have CUDA >= 10.2. To enable "
        "deterministic behavior in this case, you must set an environment variable before "
        "running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or "
        "CUBLAS_WORKSPACE_CONFIG=:16:8. For more information, go to "
        "https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility"
    )
    error = classify_failure(RuntimeError(text))
    assert (error.code, error.retryable) == ("invalid_spec", False)
    assert error.message.startswith("deterministic: cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8")


def test_only_the_op_name_of_a_refusal_is_quoted() -> None:
    text = (
        "/home/w/TOP-SECRET x does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'. You can turn off determinism ..."
    )
    error = classify_failure(RuntimeError(text))
    assert error.code == "invalid_spec" and "SECRET" not in error.message
