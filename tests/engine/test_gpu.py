"""CUDA: every precision trains; steps between flushes never make the host wait for the GPU
(counted with PyTorch's GPU trace hooks, which see event waits too); the data path and the
math-mode switches are what the engine says; a real CUDA OOM is retried smaller; a
``deterministic`` run resumes bit for bit, and without cuBLAS's setting fails naming it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.components.base import DataInfo
from amptrain.contract.errors import PrecisionFallbackError
from amptrain.contract.spec import parse_spec
from amptrain.engine import Components, RunContext, Trainer
from amptrain.engine.host import HostWaits
from tests.support.sinks import ListSink

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

MLP = {
    "model": {"name": "mlp", "args": {"width": 64}},
    "dataset": {"name": "synthetic-classification"},
}
CNN = {
    "model": {"name": "cnn", "args": {"width": 16, "depth": 2}},
    "dataset": {"name": "synthetic-images", "args": {"height": 32, "width": 32}},
}


def needs(precision: str) -> None:
    if precision in ("bf16", "tf32") and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip(f"{precision} needs compute capability >= 8.0")


def spec(precision: str, parts: dict[str, Any] = MLP, **overrides: Any) -> Any:
    return parse_spec(
        {
            **parts,
            "max_steps": 40,
            "batch_size": 64,
            "precision": precision,
            "device": "cuda",
            "optimizer": {"name": "adamw", "lr": 3e-3},
            **overrides,
        }
    )


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32", "fp32"])
def test_every_precision_trains_on_cuda(precision: str) -> None:
    needs(precision)
    sink = ListSink()
    result = Trainer(spec(precision), RunContext(None, sink=sink)).train()
    metrics = [r for r in sink.items if r["kind"] == "metric"]
    assert result.precision.effective == precision and len(metrics) == 40
    assert math.isfinite(metrics[-1]["loss"]) and metrics[-1]["loss"] < metrics[0]["loss"]
    assert metrics[-1]["memory_allocated"] > 0  # CUDA allocator figures
    assert (metrics[-1]["loss_scale"] is not None) == (precision == "fp16")


def test_the_host_wait_counter_sees_event_waits_and_item() -> None:
    # The control: what set_sync_debug_mode misses (an event wait) is counted here.
    x = torch.ones(1024, device="cuda")
    event = torch.cuda.Event()
    torch.cuda.synchronize()
    with HostWaits() as waits:
        (x * 2).sum()
        event.record()
        event.synchronize()
        float(x.sum())
    assert waits.by_kind["event_synchronization"] == 1
    assert waits.by_kind["stream_synchronization"] >= 1


@pytest.mark.parametrize(
    ("precision", "parts", "optimizer"),
    [
        ("fp16", MLP, "adamw"),
        ("fp16", MLP, "sgd"),
        ("bf16", MLP, "adamw"),
        ("tf32", MLP, "adamw"),
        ("fp32", MLP, "sgd"),
        ("bf16", CNN, "sgd"),  # images built on the GPU, channels_last
        ("fp16", CNN, "adamw"),
    ],
)
def test_steps_between_flushes_make_the_host_wait_for_nothing(
    precision: str, parts: dict[str, Any], optimizer: str
) -> None:
    needs(precision)
    # fp16 starts with an overflowing scale so skipped steps (and the device schedule) happen.
    trainer = Trainer(
        spec(
            precision,
            parts,
            optimizer={"name": optimizer, "lr": 1e-3},
            schedule={"name": "cosine", "warmup_steps": 3},
            grad_accum_steps=2,
            loss_scale={"init_scale": 2.0**24, "growth_interval": 2},
            telemetry={"flush_every_steps": 1000, "flush_every_ms": 600_000},
        ),
        RunContext(None),
    )
    for _ in range(3):  # warm-up: lazy optimizer state, cuDNN autotuning, the allocator
        trainer.train_step()
    trainer.telemetry.flush()
    torch.cuda.synchronize()
    seam = trainer.telemetry.host.count
    torch.cuda.set_sync_debug_mode("error")
    try:
        with HostWaits() as waits:
            for _ in range(12):
                trainer.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # Nothing in the training thread, and no device-wide sync from any thread.
    me = threading.current_thread().name
    assert waits.by_thread[me] == 0, (dict(waits.by_kind), dict(waits.by_thread))
    assert waits.by_kind["device_synchronization"] == 0, dict(waits.by_kind)
    assert trainer.telemetry.host.count == seam
    with HostWaits() as at_flush:
        trainer.telemetry.flush()
    assert trainer.telemetry.host.count == seam + 1 and at_flush.total >= 1
    last = trainer.telemetry.last_record
    assert last is not None and last["step"] == 15 and math.isfinite(last["loss"])
    if precision == "fp16":
        assert trainer.telemetry.skipped_steps > 0
    trainer.feeder.close()


def test_a_host_dataset_is_built_into_pinned_buffers_and_copied_as_soon_as_it_is_built() -> None:
    trainer = Trainer(
        spec("bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp16"), RunContext(None)
    )
    feeder = trainer.feeder
    assert not feeder.on_device and feeder.fills and feeder._copy_stream is not None
    x, y = feeder.get(0, 64)
    assert x.is_cuda and y.is_cuda
    expected = trainer.dataset.batch(0, 64)
    assert torch.equal(x.cpu(), expected[0]) and torch.equal(y.cpu(), expected[1])
    for ahead in feeder._ahead:  # nobody asked for these yet: their copies are queued anyway
        delivery = ahead.future.result(timeout=30)
        assert delivery.ready is not None and delivery.tensors[0].is_cuda
    slots = feeder._buffers._slots
    assert slots and all(slot.views()[0].is_pinned() for slot in slots)
    trainer.feeder.close()


def test_due_flushes_on_a_gpu_wait_for_nothing_and_publish_one_flush_later() -> None:
    sink = ListSink()
    # With per-layer norms every other step: they ride in the same one copy per flush.
    telemetry = {"flush_every_steps": 4, "flush_every_ms": 600_000, "layer_grad_norms_every": 2}
    trainer = Trainer(spec("fp16", telemetry=telemetry), RunContext(None, sink=sink))
    for _ in range(4):  # warm-up; step 1 reads at once, step 4 queues its window
        trainer.train_step()
    trainer.telemetry.flush()
    torch.cuda.synchronize()
    seam = trainer.telemetry.host.count
    with HostWaits() as waits:
        for _ in range(12):  # three due flushes: steps 8, 12 and 16
            trainer.train_step()
    me = threading.current_thread().name
    assert waits.by_thread[me] == 0, (dict(waits.by_kind), dict(waits.by_thread))
    assert trainer.telemetry.host.count == seam + 3  # one copy queued per flush
    trainer.telemetry.flush()
    assert trainer.publisher.wait_delivered(30)
    metrics = sink.metrics()
    assert sorted(metrics) == list(range(1, 17))
    assert all(
        metrics[s]["step_time_ms"] > 0 and math.isfinite(metrics[s]["loss"]) for s in metrics
    )
    layers = [r for r in sink.items if r["kind"] == "layer_grad_norm"]
    assert [r["step"] for r in layers] == list(range(2, 17, 2))
    assert all(r["values"] for r in layers)
    trainer.feeder.close()


def test_conv_models_run_channels_last_on_images_built_on_the_gpu() -> None:
    trainer = Trainer(spec("fp16", CNN), RunContext(None))
    assert trainer.channels_last and trainer.feeder.on_device
    conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    x, _ = trainer.feeder.get(0, 8)
    assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
    assert torch.backends.cudnn.benchmark


def test_tf32_switches_follow_the_precision_and_are_restored_after_the_run() -> None:
    needs("tf32")
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = (matmul.fp32_precision, conv.fp32_precision)
    # PyTorch's defaults (Trainers built by earlier tests and never run leave theirs set).
    matmul.fp32_precision, conv.fp32_precision = "none", "tf32"
    try:
        fp32 = Trainer(spec("fp32", max_steps=2), RunContext(None))
        assert (matmul.fp32_precision, conv.fp32_precision) == ("ieee", "ieee")
        fp32.train()
        tf32 = Trainer(spec("tf32", max_steps=2), RunContext(None))
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")
        tf32.train()
        assert (matmul.fp32_precision, conv.fp32_precision) == ("none", "tf32")
        assert matmul.allow_tf32 is False  # readable again (it raises while tf32 is set)
    finally:
        matmul.fp32_precision, conv.fp32_precision = saved


class Hungry(torch.nn.Module):
    """Asks the CUDA allocator for 30% of the GPU per sample: a micro-batch of 8 or 4 cannot
    get it (a real OOM), 2 can."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.per_sample = int(torch.cuda.get_device_properties(0).total_memory * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(
            x.shape[0] * self.per_sample // 4, dtype=torch.float32, device=x.device
        )
        del scratch
        return self.fc(x)


class Small:
    info = DataInfo("classification", (4,), 2)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(start, start + size)
        return torch.cos(idx[:, None] * torch.ones(1, 4)), idx % 2


def test_a_real_cuda_oom_halves_the_micro_batch_and_training_goes_on() -> None:
    sink = ListSink()
    parts = Components(Hungry(), Small(), torch.nn.functional.cross_entropy)
    trainer = Trainer(
        spec("fp32", max_steps=3, batch_size=8, auto_micro_batch=True),
        RunContext(None, sink=sink),
        parts,
    )
    result = trainer.train()
    assert result.final_step == 3 and trainer.state.micro_batch == 2
    assert [e["data"]["new"] for e in sink.events("micro_batch")] == [4, 2]
    # The failed attempts' cache was handed back once their activations were gone.
    assert torch.cuda.memory_reserved() < torch.cuda.get_device_properties(0).total_memory * 0.7


def test_fp16_beyond_its_range_falls_back_where_the_gpu_has_native_bf16() -> None:
    scaled = {**MLP, "dataset": {**MLP["dataset"], "args": {"feature_scale": 1e6}}}
    job = spec("fp16", scaled, health={"fallback": "auto"})
    with pytest.raises(PrecisionFallbackError) as info:
        Trainer(job, RunContext(None, sink=ListSink())).train()
    native = torch.cuda.get_device_capability()[0] >= 8
    assert info.value.fallback_to == ("bf16" if native else "fp32")
    # The next attempt, in that precision, trains: finite losses from step 1.
    sink = ListSink()
    ctx = RunContext(None, sink=sink, precision_override=info.value.fallback_to)
    result = Trainer(job, ctx).train()
    assert result.precision.effective == info.value.fallback_to
    assert all(math.isfinite(r["loss"]) for r in sink.items if r["kind"] == "metric")


def fresh_process(
    args: list[str], cublas: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a new process, as the worker's training process runs: torch reads
    ``CUBLAS_WORKSPACE_CONFIG`` once, at a process's first cuBLAS call, which in this one
    earlier tests made without it."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    if cublas is not None:
        env["CUBLAS_WORKSPACE_CONFIG"] = cublas
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_deterministic_run_resumed_midway_equals_the_uninterrupted_one_bit_for_bit(
    tmp_path: Path,
) -> None:
    # A CNN (cuDNN weight gradients), a transformer with attention dropout (flash/memory-
    # efficient backward) and per-layer norms (index_add_): the kernels that use atomics
    # unless deterministic mode is on. Parameters and every resumed step's loss and gradient
    # norm must equal the straight run's exactly.
    done = fresh_process(
        ["-m", "tests.engine.deterministic_resume", str(tmp_path), "cuda"], ":4096:8", 300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"cnn": [], "transformer": []}, found


WITHOUT_CUBLAS_SETTING = """
import json
from amptrain.contract.errors import classify_failure
from tests.engine.test_gpu import spec
from amptrain.engine import RunContext, Trainer
try:
    Trainer(spec("fp32", max_steps=2, deterministic=True), RunContext(None)).train()
    print(json.dumps(None))
except Exception as exc:
    print(json.dumps(classify_failure(exc).to_dict()))
"""


def test_a_deterministic_job_without_the_cublas_setting_fails_naming_it() -> None:
    # `amptrain train` run without the variable (the worker sets it): torch refuses the first
    # matmul, and the user reads which option needs what, not `internal`.
    done = fresh_process(["-c", WITHOUT_CUBLAS_SETTING], None, 120)
    assert done.returncode == 0, done.stderr[-4000:]
    error = json.loads(done.stdout.strip().splitlines()[-1])
    assert error is not None and error["code"] == "invalid_spec", error
    assert "deterministic: cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8" in error["message"]
