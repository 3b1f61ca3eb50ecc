"""The precision policy (CUDA capability, the CPU bf16 probe, tf32), the math-mode switches
and the fp32 island."""

from __future__ import annotations

import pytest
import torch

from amptrain.contract.errors import InvalidSpecError
from amptrain.engine import PrecisionChoice, choose_precision, cpu_probe, fp32_island
from amptrain.engine import precision as precision_mod
from amptrain.engine.cpu_probe import Bf16Probe, CpuFeatures
from amptrain.engine.precision import apply_math_mode

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


@pytest.fixture
def fake_cpu(monkeypatch: pytest.MonkeyPatch):
    """Pretend to be a CPU with given flags whose bf16 probe measures ``speedup`` (None: the
    policy must not need to measure)."""

    def set_cpu(*, amx: bool, avx512_bf16: bool, speedup: float | None = None) -> list[int]:
        probes: list[int] = []

        def probe() -> Bf16Probe:
            assert speedup is not None, "the policy measured a CPU whose flags decide alone"
            probes.append(1)
            return Bf16Probe(fp32_ms=10.0 * speedup, bf16_ms=10.0, threads=2)

        features = CpuFeatures(amx=amx, avx512_bf16=avx512_bf16, isa="AVX512")
        monkeypatch.setattr(precision_mod, "cpu_features", lambda: features)
        monkeypatch.setattr(precision_mod, "measure_bf16", probe)
        return probes

    return set_cpu


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "speedup", "effective", "named"),
    [
        (True, True, None, "bf16", "AMX"),
        (True, False, None, "bf16", "AMX"),
        (False, True, 3.3, "bf16", "bf16 measured 3.30x fp32"),
        (False, True, 1.2, "bf16", "bf16 measured 1.20x fp32"),
        (False, True, 1.19, "fp32", "bf16 measured 1.19x fp32"),
        (False, True, 0.15, "fp32", "bf16 measured 0.15x fp32"),
        (False, False, None, "fp32", "emulated"),
    ],
)
def test_auto_on_cpu_takes_bf16_with_amx_or_where_the_probe_measures_it_faster(
    fake_cpu, amx: bool, avx512_bf16: bool, speedup: float | None, effective: str, named: str
) -> None:
    probes = fake_cpu(amx=amx, avx512_bf16=avx512_bf16, speedup=speedup)
    choice = choose_precision("auto", torch.device("cpu"))
    assert (choice.effective, choice.device) == (effective, "cpu")
    assert "CPU" in choice.reason and named in choice.reason
    assert len(probes) == (1 if speedup is not None else 0)
    assert choice.autocast_dtype == (torch.bfloat16 if effective == "bf16" else None)
    assert not choice.uses_scaler  # never fp16 on a CPU


def test_the_bf16_probe_measures_both_precisions_and_leaves_the_rng_alone() -> None:
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    probe = cpu_probe.measure_bf16.__wrapped__(repeats=2)  # uncached: really measure
    assert torch.equal(torch.rand(3), expected)
    assert probe.fp32_ms > 0 and probe.bf16_ms > 0 and probe.threads == torch.get_num_threads()
    assert probe.speedup == pytest.approx(probe.fp32_ms / probe.bf16_ms)
    assert f"{probe.speedup:.2f}x" in probe.describe() and probe.to_dict()["speedup"] > 0


def test_explicit_low_precision_on_cpu_is_allowed_and_says_it_is_emulated(fake_cpu) -> None:
    fake_cpu(amx=False, avx512_bf16=False)
    choice = choose_precision("bf16", torch.device("cpu"))
    assert choice.effective == "bf16" and "emulated" in choice.reason
    assert not choice.uses_scaler and choose_precision("fp16", torch.device("cpu")).uses_scaler
    fake_cpu(amx=False, avx512_bf16=True)
    assert "'auto' measures it" in choose_precision("bf16", torch.device("cpu")).reason


def test_tf32_is_a_precision_of_its_own_and_fp32_is_strict(fake_gpu, fake_cpu) -> None:
    fake_gpu(9, 0)
    tf32, fp32 = choose_precision("tf32", CUDA), choose_precision("fp32", CUDA)
    assert (tf32.effective, tf32.autocast_dtype, tf32.uses_scaler) == ("tf32", None, False)
    assert "TF32" in tf32.reason and "strict IEEE" in fp32.reason and fp32.effective == "fp32"
    fake_gpu(7, 0)  # no TF32 units: IEEE fp32, and the reason says why
    old = choose_precision("tf32", CUDA)
    assert old.effective == "fp32" and "needs capability >= 8.0" in old.reason
    fake_cpu(amx=True, avx512_bf16=True)
    on_cpu = choose_precision("tf32", torch.device("cpu"))
    assert on_cpu.effective == "fp32" and "CUDA" in on_cpu.reason
    with pytest.raises(InvalidSpecError, match="precision: unknown value 'fp8'"):
        choose_precision("fp8", torch.device("cpu"))


@pytest.fixture
def restore_math_flags():
    saved = _math_flags()
    yield
    torch.backends.cudnn.benchmark = saved[0]
    torch.backends.cuda.matmul.fp32_precision = saved[1]
    torch.backends.cudnn.conv.fp32_precision = saved[2]
    torch.backends.cudnn.rnn.fp32_precision = saved[3]


def _math_flags() -> tuple[bool, str, str, str]:
    return (
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
        torch.backends.cudnn.rnn.fp32_precision,
    )


@pytest.mark.parametrize(
    ("effective", "mode"), [("fp32", "ieee"), ("tf32", "tf32"), ("bf16", "tf32"), ("fp16", "tf32")]
)
def test_a_cuda_job_sets_tf32_and_cudnn_autotuning_deliberately(
    restore_math_flags, effective: str, mode: str
) -> None:
    # The switches are process-wide flags; setting them needs no GPU.
    torch.backends.cudnn.benchmark = False
    choice = PrecisionChoice(effective, effective, "test", "cuda")  # type: ignore[arg-type]
    apply_math_mode(choice, CUDA)
    assert _math_flags() == (True, mode, mode, mode)
    apply_math_mode(choice, torch.device("cpu"))  # a CPU job leaves them alone
    assert _math_flags() == (True, mode, mode, mode)


@pytest.mark.parametrize("effective", ["fp32", "tf32", "bf16"])
def test_the_math_mode_of_a_run_is_put_back_as_it_was(restore_math_flags, effective: str) -> None:
    before = _math_flags()
    legacy = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    choice = PrecisionChoice(effective, effective, "test", "cuda")  # type: ignore[arg-type]
    restore = apply_math_mode(choice, CUDA)
    mode = "ieee" if effective == "fp32" else "tf32"
    assert _math_flags() == (True, mode, mode, mode)
    restore()
    assert _math_flags() == before
    # Readable again through the legacy API (it raises while the run's settings are in force).
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == legacy
    apply_math_mode(choice, torch.device("cpu"))()  # a CPU job: nothing set, nothing to restore
    assert _math_flags() == before


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


def test_cpu_auto_decides_by_the_measurement_it_is_given_without_measuring_again() -> None:
    from amptrain.engine import precision
    from amptrain.engine.cpu_probe import Bf16Probe

    fast = precision._cpu_auto(False, True, Bf16Probe(fp32_ms=10.0, bf16_ms=5.0, threads=2))
    slow = precision._cpu_auto(False, True, Bf16Probe(fp32_ms=10.0, bf16_ms=20.0, threads=2))
    assert fast[0] == "bf16" and "2.00x" in fast[1]
    assert slow[0] == "fp32" and "0.50x" in slow[1]
    # What the worker's report carries survives the trip to the training process.
    probe = Bf16Probe(fp32_ms=12.5, bf16_ms=9.0, threads=4)
    assert Bf16Probe.from_dict(probe.to_dict()) == probe
