"""The AMP step: skipped steps, the fp32 loss island, OOM handling (in the forward, the backward
or the optimizer step), divergence and warnings."""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amptrain.components.base import DataInfo
from amptrain.contract.errors import DivergedError, InvalidSpecError, OutOfMemoryError
from amptrain.contract.spec import parse_spec
from amptrain.engine import Components, RunContext, Trainer, loop
from amptrain.engine.oom import is_out_of_memory, smaller_micro_batch
from tests.support.sinks import ListSink


class TinyData:
    """Deterministic per-sample stream: sample i depends only on i."""

    info = DataInfo("classification", (8,), 4)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(start, start + size)
        x = torch.sin(idx[:, None].float() * torch.linspace(0.1, 1.7, 8)[None, :])
        return x, idx % 4


class TinyNet(nn.Module):
    """Two layers; raises OOM for micro-batches above ``oom_above`` and counts samples seen."""

    def __init__(self, oom_above: int | None = None) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
        self.oom_above = oom_above
        self.samples_seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected, batch {x.shape[0]})")
        self.samples_seen += x.shape[0]
        return self.fc2(F.gelu(self.fc1(x)))


def spec(**overrides: Any) -> Any:
    base: dict[str, Any] = {
        "model": {"name": "mlp"},
        "dataset": {"name": "synthetic-classification"},
        "max_steps": 6,
        "batch_size": 8,
        "device": "cpu",
        "schedule": {"name": "linear"},
        "telemetry": {"flush_every_steps": 2, "flush_every_ms": 60_000},
    }
    return parse_spec({**base, **overrides})


def components(
    build: Callable[[], nn.Module] = TinyNet, loss_fn: Any = F.cross_entropy
) -> Components:
    """The model is built *after* the seed, so its initial weights never depend on what
    another test left in the global generator."""
    torch.manual_seed(0)
    return Components(model=build(), dataset=TinyData(), loss_fn=loss_fn)


def test_inf_gradient_skips_the_step_halves_the_scale_and_leaves_weights_untouched() -> None:
    k = 3
    sink = ListSink()
    snapshots: dict[int, list[torch.Tensor]] = {}
    trainer: Trainer

    def snapshot_params() -> None:
        snapshots[trainer.step] = [p.detach().clone() for p in trainer.model.parameters()]

    ctx = RunContext(checkpoint_dir=None, sink=sink, should_stop=lambda: snapshot_params())
    trainer = Trainer(
        spec(precision="fp16", loss_scale={"init_scale": 1024, "growth_interval": 1000}),
        ctx,
        components(),
    )
    model_ = trainer.model
    assert isinstance(model_, TinyNet)
    model_.fc1.weight.register_hook(
        lambda g: torch.full_like(g, math.inf) if trainer.step + 1 == k else g
    )
    result = trainer.train()
    snapshot_params()

    m = sink.metrics()
    assert [m[s]["skipped"] for s in range(1, 7)] == [False, False, True, False, False, False]
    assert m[k]["grad_norm"] is None and m[k - 1]["grad_norm"] is not None
    assert m[k]["loss_scale"] == 1024 and m[k + 1]["loss_scale"] == 512
    assert m[k]["skipped_steps"] == 1 and result.skipped_steps == 1
    # Weights untouched by step k; the next step moves them again.
    assert all(torch.equal(a, b) for a, b in zip(snapshots[k - 1], snapshots[k], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(snapshots[k], snapshots[k + 1], strict=True))
    # The skipped step did not advance the (linear, decaying) schedule.
    assert m[k + 1]["lr"] == m[k]["lr"] < m[k - 1]["lr"]
    assert m[k + 2]["lr"] < m[k + 1]["lr"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_engine_computes_the_loss_in_an_fp32_island(precision: str) -> None:
    seen: list[tuple[torch.dtype, bool]] = []

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append((logits.dtype, torch.is_autocast_enabled("cpu")))
        return F.cross_entropy(logits, targets)

    logits_dtypes: list[torch.dtype] = []
    trainer = Trainer(
        spec(precision=precision, max_steps=2), RunContext(None), components(loss_fn=loss_fn)
    )
    trainer.model.register_forward_hook(lambda _m, _i, out: logits_dtypes.append(out.dtype))
    trainer.train()
    low = torch.float16 if precision == "fp16" else torch.bfloat16
    assert set(logits_dtypes) == {low}  # the forward really ran under autocast
    assert set(seen) == {(torch.float32, False)}


def test_oom_with_auto_micro_batch_halves_and_keeps_the_effective_batch() -> None:
    sink = ListSink()
    trainer = Trainer(
        spec(batch_size=16, auto_micro_batch=True),
        RunContext(None, sink=sink),
        components(lambda: TinyNet(oom_above=4)),
    )
    model = trainer.model
    assert isinstance(model, TinyNet)
    result = trainer.train()
    assert result.final_step == 6
    assert [
        (e["data"]["old"], e["data"]["new"], e["data"]["grad_accum_steps"])
        for e in sink.events("micro_batch")
    ] == [
        (16, 8, 2),
        (8, 4, 4),
    ]
    assert (trainer.state.micro_batch, trainer.state.grad_accum) == (4, 4)
    assert model.samples_seen == 6 * 16  # every step still saw the full batch


def test_oom_without_auto_micro_batch_names_the_micro_batch() -> None:
    trainer = Trainer(
        spec(batch_size=16, grad_accum_steps=2),
        RunContext(None),
        components(lambda: TinyNet(oom_above=4)),
    )
    with pytest.raises(OutOfMemoryError) as info:
        trainer.train()
    assert "micro-batch 8" in info.value.message and "peak memory" in info.value.message
    assert info.value.step == 1


class LibraryOomNet(TinyNet):
    """Fails like cuBLAS on a full GPU (a RuntimeError, not torch.OutOfMemoryError) above
    ``oom_above`` samples per micro-batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise RuntimeError(
                "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
            )
        return super().forward(x)


def test_a_cublas_allocation_failure_is_an_oom_that_auto_micro_batch_shrinks_past() -> None:
    sink = ListSink()
    trainer = Trainer(
        spec(batch_size=16, auto_micro_batch=True),
        RunContext(None, sink=sink),
        components(lambda: LibraryOomNet(oom_above=4)),
    )
    model = trainer.model
    assert isinstance(model, LibraryOomNet)
    assert trainer.train().final_step == 6
    assert [e["data"]["new"] for e in sink.events("micro_batch")] == [8, 4]
    assert model.samples_seen == 6 * 16


@pytest.mark.parametrize(
    ("message", "oom"),
    [
        ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
        ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
        ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", True),
        ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", True),
        ("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory", True),
        # Failures a smaller micro-batch does not cure stay errors.
        ("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm(...)`", False),
        ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in", False),
        ("CUDA error: an illegal memory access was encountered", False),
    ],
)
def test_library_allocation_failures_are_classified_as_out_of_memory(
    message: str, oom: bool
) -> None:
    assert is_out_of_memory(RuntimeError(message)) is oom
    assert is_out_of_memory(ValueError(message)) is False  # only what torch raises


def test_nonfinite_loss_stops_a_bf16_run_naming_the_step(read_mode: str) -> None:
    trainer: Trainer

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits, targets)
        return loss * math.nan if trainer.step >= 4 else loss  # steps 5, 6, 7, ... are NaN

    sink = ListSink()
    trainer = Trainer(
        spec(precision="bf16", max_steps=30, health={"diverge_nonfinite_steps": 3}),
        RunContext(None, sink=sink),
        components(loss_fn=loss_fn),
    )
    with pytest.raises(DivergedError) as info:
        trainer.train()
    assert info.value.step == 7 and "diverged at step 7" in info.value.message
    # Detection lags by at most one flush of 2 steps (one GPU: two, reading a window late).
    assert trainer.step <= 7 + (2 if read_mode == "at_once" else 4)
    # The records up to the failure were delivered, and none after it: the job's history
    # ends at the step its error names.
    assert max(sink.metrics()) == 7


@pytest.mark.usefixtures("read_mode")  # a divergence: in both read modes
def test_fp16_overflow_warnings_then_divergence_suggests_bf16() -> None:
    sink = ListSink()
    trainer = Trainer(
        spec(
            precision="fp16",
            max_steps=100,
            loss_scale={"init_scale": 1024, "growth_interval": 1000},
            health={
                "warn_loss_scale_below": 128,
                "warn_consecutive_skips": 5,
                "diverge_loss_scale_floor": 0.5,
            },
        ),
        RunContext(None, sink=sink),
        components(),
    )
    model_ = trainer.model
    assert isinstance(model_, TinyNet)
    model_.fc2.bias.register_hook(
        lambda g: torch.full_like(g, math.inf) if trainer.step >= 1 else g
    )
    with pytest.raises(DivergedError) as info:
        trainer.train()
    # Step 1 is clean; step n >= 2 overflows with scale 1024 / 2**(n-2): 0.25 < 0.5 at step 14.
    assert info.value.step == 14 and "bf16" in info.value.message
    warnings = {e["data"]["code"]: e for e in sink.events("warning")}
    assert warnings["consecutive_skips"]["step"] == 6
    assert warnings["low_loss_scale"]["step"] == 6  # scale 64 < 128
    assert "frequent gradient overflow" in warnings["low_loss_scale"]["data"]["message"]


class OomOnce(TinyNet):
    """Raises one OOM in its forward during step ``at`` (1-based), then trains normally."""

    def __init__(self, at: int = 3) -> None:
        super().__init__()
        self.at = at
        self.trainer: Trainer | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.trainer is not None and self.trainer.step + 1 == self.at:
            self.at = -1
            raise torch.OutOfMemoryError("CUDA out of memory (injected in the forward)")
        return super().forward(x)


def _oom_in_optimizer_step_once(trainer: Trainer, at: int) -> None:
    step = trainer.optimizer.step

    def failing_step(*args: Any, **kwargs: Any) -> Any:
        nonlocal at
        if trainer.step + 1 == at:
            at = -1
            raise torch.OutOfMemoryError("CUDA out of memory (injected in the optimizer step)")
        return step(*args, **kwargs)

    trainer.optimizer.step = failing_step  # type: ignore[method-assign]


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_an_oom_in_the_optimizer_step_is_retried_like_one_in_the_forward(precision: str) -> None:
    # fp16: the retried step must unscale again, so the scaler's stage has to be reset.
    spec_ = spec(batch_size=16, auto_micro_batch=True, precision=precision)
    a = Trainer(spec_, RunContext(None, sink=(sink_a := ListSink())), components(OomOnce))
    assert isinstance(a.model, OomOnce)
    a.model.trainer = a
    a.train()
    b = Trainer(spec_, RunContext(None, sink=(sink_b := ListSink())), components())
    _oom_in_optimizer_step_once(b, at=3)
    b.train()
    for sink in (sink_a, sink_b):
        (event,) = sink.events("micro_batch")
        assert (event["step"], event["data"]["old"], event["data"]["new"]) == (2, 16, 8)
    assert (b.state.micro_batch, b.state.grad_accum, b.step) == (8, 2, 6)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert [m["loss"] for m in sink_a.metrics().values()] == [
        m["loss"] for m in sink_b.metrics().values()
    ]


def test_an_oom_in_the_optimizer_step_without_auto_micro_batch_names_it() -> None:
    trainer = Trainer(spec(batch_size=16, precision="fp16"), RunContext(None), components())
    _oom_in_optimizer_step_once(trainer, at=2)
    with pytest.raises(OutOfMemoryError) as info:
        trainer.train()
    assert info.value.step == 2 and "micro-batch 16" in info.value.message


def test_cached_memory_is_released_after_the_failed_steps_activations_are_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    activations: list[weakref.ref[torch.Tensor]] = []
    seen: list[tuple[bool, bool]] = []

    class Big(TinyNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > 4:
                activation = torch.ones(x.shape[0], 4096)  # held by this frame when it raises
                activations.append(weakref.ref(activation))
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return super().forward(x)

    def release(device: torch.device) -> None:
        handling = sys.exc_info()[0] is not None
        seen.append((handling, any(ref() is not None for ref in activations)))

    monkeypatch.setattr(loop, "release_cached", release)
    # An explicit precision: auto's probe would run the copy's forward (and fail) first.
    job = spec(batch_size=16, auto_micro_batch=True, precision="fp32")
    Trainer(job, RunContext(None), components(Big)).train()
    assert len(activations) == 2  # 16 -> 8 -> 4
    assert seen == [(False, False), (False, False)]  # no exception in flight, activations freed


def test_a_spec_for_two_devices_refuses_to_run_as_one_process() -> None:
    with pytest.raises(InvalidSpecError) as info:
        Trainer(spec(devices=2), RunContext(None), components())
    assert "asks for 2 data-parallel process(es) but 1 were started" in info.value.message
    assert "--nproc-per-node 2" in info.value.message


def test_with_several_devices_an_oom_fails_the_attempt_instead_of_halving() -> None:
    with pytest.raises(OutOfMemoryError) as info:
        smaller_micro_batch(spec(devices=2), step=3, old=4, grad_accum=1, peak=2**20)
    assert "4 x 1 accumulation steps x 2 devices" in info.value.message
    assert "with devices or nodes > 1 the micro-batch cannot shrink" in info.value.message
