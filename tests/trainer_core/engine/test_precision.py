"""The precision policy and the fp32 island."""

from __future__ import annotations

import pytest
import torch

from trainer_core.contract.errors import InvalidSpecError
from trainer_core.engine import choose_precision, fp32_island
from trainer_core.engine import precision as precision_mod

CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """Pretend to have a GPU of a given capability (the policy only asks for that and a name)."""

    def set_capability(major: int, minor: int) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _d=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d=None: "FakeGPU")
        # Even when is_bf16_supported() says yes (it counts emulation), 7.x must not get bf16.
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)

    return set_capability


@pytest.mark.parametrize(
    ("capability", "effective"),
    [
        ((9, 0), "bf16"),
        ((8, 0), "bf16"),
        ((8, 6), "bf16"),
        ((7, 5), "fp16"),
        ((7, 0), "fp16"),
        ((6, 1), "fp32"),
    ],
)
def test_auto_on_cuda_follows_the_compute_capability(fake_gpu, capability, effective) -> None:
    fake_gpu(*capability)
    choice = choose_precision("auto", CUDA)
    assert choice.effective == effective
    assert f"{capability[0]}.{capability[1]}" in choice.reason
    assert choice.requested == "auto" and "FakeGPU" in choice.device


def test_explicit_bf16_on_a_gpu_without_it_fails_before_training(fake_gpu) -> None:
    fake_gpu(7, 5)
    with pytest.raises(
        InvalidSpecError, match=r"precision: bf16 needs CUDA compute capability >= 8.0"
    ):
        choose_precision("bf16", CUDA)
    assert choose_precision("fp16", CUDA).uses_scaler


@pytest.mark.parametrize(("amx", "effective"), [(False, "fp32"), (True, "bf16")])
def test_auto_on_cpu_uses_bf16_only_with_amx(
    monkeypatch: pytest.MonkeyPatch, amx: bool, effective: str
) -> None:
    monkeypatch.setattr(precision_mod, "cpu_has_amx", lambda: amx)
    choice = choose_precision("auto", torch.device("cpu"))
    assert (choice.effective, choice.device) == (effective, "cpu")
    assert ("AMX" in choice.reason) and choice.autocast_dtype == (
        None if effective == "fp32" else torch.bfloat16
    )


def test_explicit_low_precision_on_cpu_is_allowed_and_says_it_is_emulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision_mod, "cpu_has_amx", lambda: False)
    choice = choose_precision("bf16", torch.device("cpu"))
    assert choice.effective == "bf16" and "emulated" in choice.reason
    assert not choice.uses_scaler and choose_precision("fp16", torch.device("cpu")).uses_scaler


def _kl_to_uniform(logits: torch.Tensor) -> torch.Tensor:
    """KL(uniform || softmax(logits)): needs log of tiny probabilities."""
    probs = torch.softmax(logits, dim=-1)
    uniform = torch.full_like(probs, 1.0 / probs.shape[-1])
    return (uniform * (uniform.log() - probs.log())).sum(-1).mean()


@pytest.mark.parametrize(("dtype", "gap"), [(torch.float16, 30.0), (torch.bfloat16, 100.0)])
def test_fp32_island_keeps_a_fragile_loss_finite(dtype: torch.dtype, gap: float) -> None:
    # Logits far apart: exp(-gap) underflows to 0 in the low-precision dtype (log -> -inf)
    # but is still representable in fp32.
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[gap, 0.0], [0.0, 0.0]]))
    x = torch.tensor([[1.0, 0.0]])
    with torch.autocast("cpu", dtype=dtype):
        logits = layer(x)
        assert logits.dtype == dtype
        plain = _kl_to_uniform(logits)
        with fp32_island():
            assert not torch.is_autocast_enabled("cpu")
            island = _kl_to_uniform(logits.float())
        assert torch.is_autocast_enabled("cpu")  # the island closes again
    assert not torch.isfinite(plain)
    assert torch.isfinite(island) and island.dtype == torch.float32
    assert island.item() == pytest.approx(gap / 2 - 0.6931, rel=1e-3)
