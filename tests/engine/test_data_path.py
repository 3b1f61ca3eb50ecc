"""The data path: batches built ahead in background threads (straight into reused buffers,
in parts, for datasets that can fill), exactly the samples asked for, at the rank's stride,
restarted where the trainer asks, and resume still bitwise exact."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.components.base import DataInfo
from amptrain.contract.errors import PreemptedError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.data import Feeder, default_builders
from tests.support.stack import wait_until

CPU = torch.device("cpu")


class Recorded:
    """Sample i is (i, i + 0.5, ...): every call is logged with the thread that made it."""

    info = DataInfo("classification", (3,), 2)

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.delay = delay

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append((threading.current_thread().name, start, size))
        time.sleep(self.delay)
        idx = torch.arange(start, start + size, dtype=torch.float32)
        return idx[:, None] + torch.tensor([0.0, 0.5, 0.25]), idx.long() % 2


def test_batches_are_built_ahead_in_a_background_thread() -> None:
    data = Recorded()
    feeder = Feeder(data, CPU, depth=3, end=60)
    try:
        x, y = feeder.get(0, 10)
        assert torch.equal(x, Recorded().batch(0, 10)[0]) and torch.equal(y, torch.arange(10) % 2)
        wait_until(lambda: len(data.calls) == 4, 10, "three batches prepared ahead")
        assert [c[1:] for c in data.calls] == [(0, 10), (10, 10), (20, 10), (30, 10)]
        assert {c[0] for c in data.calls} != {threading.current_thread().name}
        assert all(name.startswith("amptrain-data") for name, *_ in data.calls)
        for start in (10, 20, 30, 40, 50):
            assert torch.equal(feeder.get(start, 10)[0][:, 0], torch.arange(start, start + 10.0))
        assert max(start for _, start, _ in data.calls) == 50  # nothing past `end`
    finally:
        feeder.close()


def test_asking_for_another_position_or_size_restarts_the_stream_there() -> None:
    data = Recorded()
    feeder = Feeder(data, CPU, depth=2)
    try:
        feeder.get(0, 8)
        x, _ = feeder.get(4, 4)  # an OOM halving re-runs a step with smaller micro-batches
        assert torch.equal(x[:, 0], torch.arange(4, 8.0))
        x, _ = feeder.get(100, 4)  # a resume
        assert torch.equal(x[:, 0], torch.arange(100, 104.0))
    finally:
        feeder.close()


def test_time_spent_waiting_for_data_is_measured() -> None:
    feeder = Feeder(Recorded(delay=0.05), CPU, depth=1)
    try:
        for i in range(3):
            feeder.get(i * 4, 4)  # nothing else to do meanwhile: every batch is waited for
        assert 0.1 < feeder.wait_s < 5
    finally:
        feeder.close()


class Filled(Recorded):
    """``Recorded`` that can also write into given tensors, as the built-in datasets do."""

    def fill(self, start: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        x, y = Recorded.batch(self, start, len(inputs))
        inputs.copy_(x)
        targets.copy_(y)


def test_a_dataset_that_fills_is_built_in_parts_into_reused_buffers() -> None:
    data = Filled()
    feeder = Feeder(data, CPU, depth=2, end=24 * 8, builders=3)
    try:
        pointers = set()
        for start in range(0, 24 * 8, 24):
            x, y = feeder.get(start, 24)
            assert torch.equal(x[:, 0], torch.arange(start, start + 24.0))
            assert torch.equal(y, torch.arange(start, start + 24) % 2)
            pointers.add(x.data_ptr())
            del x, y  # the loop lets go of a batch once its step is done
        # Three parts of 8 per batch, each built from its own sample indices.
        fills = sorted(c[1:] for c in data.calls if c[2] == 8)
        assert fills == [(s, 8) for s in range(0, 24 * 8, 8)]
        assert all(name.startswith("amptrain-data") for name, _, size in data.calls if size == 8)
        assert len(pointers) <= feeder.depth + 2  # buffers reused, not one per batch
        assert feeder.built == 8 and feeder.misses == 1
    finally:
        feeder.close()


def test_with_several_devices_prefetch_follows_the_ranks_stride() -> None:
    # Rank 1 of 2, batch_size 8, one micro-batch of 4 per step: samples 4..7, 12..15, ...
    data = Recorded()
    feeder = Feeder(data, CPU, depth=2, end=6 * 8, share=(1, 2, 8))
    try:
        for step in range(6):
            x, _ = feeder.get(step * 8 + 4, 4)
            assert torch.equal(x[:, 0], torch.arange(step * 8 + 4, step * 8 + 8.0))
        assert feeder.misses == 1  # the first call; every later one was prepared ahead
        assert sorted(c[1] for c in data.calls) == [s * 8 + 4 for s in range(6)]
        assert feeder.built == 6  # nothing built that this rank does not use
    finally:
        feeder.close()


def test_builders_leave_a_core_to_the_training_thread() -> None:
    assert 1 <= default_builders() <= 4
    assert Feeder(Recorded(), CPU, depth=0).builders == 1  # batch() need not be thread-safe


def image_spec(**overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 16}},
            "dataset": {"name": "synthetic-images", "args": {"height": 8, "width": 8}},
            "max_steps": 10,
            "batch_size": 8,
            "grad_accum_steps": 2,
            "precision": "fp16",
            "device": "cpu",
            "optimizer": {"name": "sgd", "lr": 0.05},
            "schedule": {"name": "cosine", "warmup_steps": 2},
            "loss_scale": {"init_scale": 2.0**20, "growth_interval": 2},
            "checkpoint": {"every_steps": 4, "keep_last": 2},
            **overrides,
        }
    )


class Prefetching(Trainer):
    prefetch_depth = 2  # what CUDA jobs get; a CPU job builds its batches inline by default
    data_builders = 3  # each micro-batch of 24 built in three parts, by three threads


def test_prefetching_changes_no_value_and_resume_stays_bitwise_exact(tmp_path: Path) -> None:
    spec = image_spec(batch_size=48)
    straight = Prefetching(spec, RunContext(str(tmp_path / "straight")))
    result = straight.train()
    assert straight.feeder._pool is not None and straight.feeder.fills  # built ahead, in parts
    assert straight.feeder.misses == 1  # the whole run prepared ahead
    assert result.skipped_steps > 0  # fp16 skips: the device schedule had to hold still
    inline = Trainer(spec, RunContext(str(tmp_path / "inline")))
    inline.train()
    assert inline.feeder._pool is None

    ref: list[Trainer] = []
    first = Prefetching(
        spec,
        RunContext(
            str(tmp_path / "split"), should_stop=lambda: "preempt" if ref[0].step == 5 else None
        ),
    )
    ref.append(first)
    with pytest.raises(PreemptedError):
        first.train()
    second = Prefetching(spec, RunContext(str(tmp_path / "split")))
    assert second.train().resumed_from == 5
    for other in (inline, second):
        for (name, a), b in zip(
            straight.model.named_parameters(), other.model.parameters(), strict=True
        ):
            assert torch.equal(a, b), name
        assert straight.schedule.state_dict() == other.schedule.state_dict()
    assert torch.equal(
        straight.optimizer.state_dict()["state"][0]["momentum_buffer"],
        second.optimizer.state_dict()["state"][0]["momentum_buffer"],
    )
