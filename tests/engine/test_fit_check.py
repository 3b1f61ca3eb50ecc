"""A job too large for the device fails at once with ``too_large``, before the model
allocates anything; ordinary jobs pass the check."""

from __future__ import annotations

import re
import time
from typing import Any

import psutil
import pytest
import torch

from amptrain.components.base import DataInfo
from amptrain.contract import host_memory
from amptrain.contract.errors import TooLargeError
from amptrain.contract.sizing import DataShape, mlp_parameters
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.fit_check import check_fits, device_memory, estimate


def _spec(model_args: dict[str, Any], **extra: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": model_args},
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 64, "num_samples": 256},
            },
            "max_steps": 2,
            "batch_size": 8,
            "device": "cpu",
            "precision": "fp32",
            **extra,
        }
    )


def test_a_model_larger_than_the_device_fails_before_allocating() -> None:
    process = psutil.Process()
    rss_before = process.memory_info().rss
    started = time.monotonic()
    # ~275 billion parameters: several TiB of weights alone.
    with pytest.raises(TooLargeError) as err:
        Trainer(_spec({"width": 65536, "depth": 64}), RunContext(checkpoint_dir=None))
    assert time.monotonic() - started < 60
    assert process.memory_info().rss - rss_before < 512 * 2**20
    error = err.value
    assert (error.code, error.retryable) == ("too_large", False)
    free = device_memory(torch.device("cpu"))
    assert free is not None and free <= host_memory.total()  # type: ignore[operator]
    expected = mlp_parameters(DataShape((64,), 10, 0), {"width": 65536, "depth": 64})
    assert f"{expected:,} parameters" in error.message  # exact, counted on the meta device
    # Both numbers: what it needs and what the training process has left.
    assert re.search(r"needs about [0-9.]+ TiB", error.message), error.message
    assert re.search(r"the training process has [0-9.]+ GiB available here", error.message)


def test_activations_of_a_huge_micro_batch_count_too() -> None:
    """Few parameters, but a batch of 65536 images of 64x4096x4096 would need 256 TiB."""
    spec = parse_spec(
        {
            "model": {"name": "cnn", "args": {"width": 8, "depth": 1}},
            "dataset": {"name": "synthetic-images"},
            "max_steps": 1,
            "batch_size": 65536,
        }
    )
    info = DataInfo("classification", (64, 4096, 4096), 10)
    found = estimate(spec, info, "fp32")
    assert found is not None and found.parameters < 100_000
    # At least the input batch itself, which the first convolution keeps for its gradient.
    assert found.activation_bytes >= 65536 * 64 * 4096 * 4096 * 4
    # auto_micro_batch may shrink to one sample: the estimate takes that into account.
    shrinkable = spec.model_copy(update={"auto_micro_batch": True})
    small = estimate(shrinkable, info, "fp32")
    assert small is not None and small.micro_batch == 1
    assert small.activation_bytes * 60_000 < found.activation_bytes


def test_low_precision_halves_the_activation_estimate() -> None:
    spec = _spec({"width": 512, "depth": 4}, batch_size=256)
    info = DataInfo("classification", (64,), 10)
    fp32, bf16 = estimate(spec, info, "fp32"), estimate(spec, info, "bf16")
    assert fp32 is not None and bf16 is not None
    assert bf16.state_bytes == fp32.state_bytes  # parameters, grads and moments stay fp32
    assert bf16.activation_bytes < 0.75 * fp32.activation_bytes


def test_an_ordinary_job_passes_and_trains() -> None:
    result = Trainer(_spec({"width": 32}), RunContext(checkpoint_dir=None)).train()
    assert result.final_step == 2


def test_the_estimate_does_not_disturb_the_random_state() -> None:
    """Building on the meta device draws no random numbers: the real model's initial
    weights are the same as without the check."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    estimate(_spec({"width": 32}), DataInfo("classification", (64,), 10), "fp32")
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.gpu
def test_on_a_gpu_the_estimate_is_checked_against_its_memory() -> None:
    device = torch.device("cuda")
    total = torch.cuda.get_device_properties(device).total_memory
    assert device_memory(device) == total
    spec = _spec({"width": 65536, "depth": 64}, device="cuda")
    with pytest.raises(TooLargeError, match="the GPU has"):
        Trainer(spec, RunContext(checkpoint_dir=None))
    assert torch.cuda.memory_allocated(device) < 2**30  # nothing large was allocated
    result = Trainer(_spec({"width": 32}, device="cuda"), RunContext(checkpoint_dir=None)).train()
    assert result.final_step == 2


def test_on_a_cpu_what_other_processes_hold_is_not_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On ``amptrain up`` the API, Redis and the database share the machine: a model whose
    ~270 MiB of state fits the machine's RAM but not the 128 MiB the training process has
    left is refused (it was compared with the RAM)."""
    monkeypatch.setattr(host_memory, "available", lambda root=host_memory.ROOT: 128 * 2**20)
    with pytest.raises(TooLargeError) as err:
        Trainer(_spec({"width": 2048, "depth": 4}), RunContext(checkpoint_dir=None))
    assert "but the training process has 128.0 MiB available here" in err.value.message


def test_fsdp_fits_where_ddp_does_not_and_a_ddp_refusal_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per process, fsdp needs its shard of the state: between the two estimates, fsdp fits."""
    info = DataInfo("classification", (64,), 10)
    ddp = _spec({"width": 2048, "depth": 4}, devices=2)
    fsdp = ddp.model_copy(update={"parallelism": "fsdp"})
    needs = [estimate(s, info, "fp32") for s in (ddp, fsdp)]
    assert needs[0] is not None and needs[1] is not None
    assert needs[1].total < needs[0].total
    between = needs[0].total + needs[1].total  # the two processes' share: the mean each
    monkeypatch.setattr(host_memory, "available", lambda root=host_memory.ROOT: between)
    check_fits(fsdp, info, torch.device("cpu"), "fp32")
    with pytest.raises(TooLargeError) as err:
        check_fits(ddp, info, torch.device("cpu"), "fp32")
    assert "shard the model state across the 2 devices (parallelism: fsdp)" in err.value.message
