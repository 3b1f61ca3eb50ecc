"""Telemetry: every step once, in order, in flushes of the configured size; a slow sink never
stalls training and its drops are counted and reported; where the device is read later (a
single GPU), a due flush publishes the windows already copied and waits for none."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import torch
from torch import nn

from amptrain.components.base import DataInfo
from amptrain.contract.metrics import METRIC_FIELDS
from amptrain.contract.spec import parse_spec
from amptrain.engine import Components, RunContext, Trainer
from amptrain.engine.host import HostReads, LateHostReads
from amptrain.engine.publisher import Publisher
from amptrain.engine.telemetry import StepTelemetry
from tests.support.sinks import ListSink


def spec(**overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 32}},
            "dataset": {"name": "synthetic-classification", "args": {"features": 16}},
            "max_steps": 22,
            "batch_size": 16,
            "device": "cpu",
            **overrides,
        }
    )


class BatchSink:
    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []

    def write(self, items: list[dict[str, Any]]) -> None:
        self.batches.append(list(items))

    def close(self) -> None:
        pass

    def metric_batches(self) -> list[list[dict[str, Any]]]:
        return [
            b for b in ([r for r in batch if r["kind"] == "metric"] for batch in self.batches) if b
        ]


def test_every_step_reaches_the_sink_once_in_order_in_flushes_of_the_configured_size() -> None:
    sink = BatchSink()
    spec_ = spec(precision="fp16", telemetry={"flush_every_steps": 4, "flush_every_ms": 600_000})
    result = Trainer(spec_, RunContext(None, sink=sink)).train()

    batches = sink.metric_batches()
    # The first step flushes alone (a watcher sees the run start), then every 4th step;
    # the last flush is the end of training.
    assert [len(b) for b in batches] == [1, 3, 4, 4, 4, 4, 2]
    records = [r for b in batches for r in b]
    assert [r["step"] for r in records] == list(range(1, 23))
    assert sink.batches[0][0]["type"] == "precision"  # the first thing sent
    for r in records:
        assert tuple(k for k in r if k != "kind") == METRIC_FIELDS
        assert math.isfinite(r["loss"]) and r["lr"] > 0 and r["loss_scale"] == 65536.0
        assert r["skipped"] is False and r["grad_norm"] > 0 and r["skipped_steps"] == 0
        assert r["memory_allocated"] > 0 and r["memory_peak"] >= r["memory_allocated"]
        assert r["step_time_ms"] > 0 and r["samples_per_second"] > 0
    assert [r["time"] for r in records] == sorted(r["time"] for r in records)
    assert records[-1]["loss"] < records[0]["loss"]
    assert result.last_record == records[-1] and result.dropped_records == 0


class Data:
    info = DataInfo("classification", (4,), 2)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(start, start + size)
        return torch.cos(idx[:, None] * torch.ones(1, 4)), idx % 2


class SlowNet(nn.Linear):
    """Each forward takes >= 3 ms, so a 1 ms flush interval is always due after a step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.003)
        return super().forward(x)


def test_the_time_limit_flushes_before_the_step_count() -> None:
    sink = BatchSink()
    parts = Components(SlowNet(4, 2), Data(), nn.functional.cross_entropy)
    spec_ = spec(max_steps=5, telemetry={"flush_every_steps": 1000, "flush_every_ms": 1})
    Trainer(spec_, RunContext(None, sink=sink), parts).train()
    assert [len(b) for b in sink.metric_batches()] == [1, 1, 1, 1, 1]


class BlockedSink:
    """Blocks in its first write until released; records what it was given."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.items: list[dict[str, Any]] = []

    def write(self, items: list[dict[str, Any]]) -> None:
        self.entered.set()
        self.release.wait(timeout=60)
        self.items += items

    def close(self) -> None:
        pass


def test_a_blocked_sink_does_not_stall_training_and_drops_are_counted() -> None:
    sink = BlockedSink()
    spec_ = spec(
        max_steps=40, telemetry={"flush_every_steps": 2, "flush_every_ms": 600_000, "queue_size": 6}
    )
    trainer = Trainer(spec_, RunContext(None, sink=sink))
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(trainer.train()))
    thread.start()
    try:
        assert sink.entered.wait(timeout=30)
        deadline = time.monotonic() + 60
        while trainer.step < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        # Every step ran while the sink was still stuck in its first write.
        assert trainer.step == 40 and not sink.release.is_set()
    finally:
        sink.release.set()
        thread.join(timeout=60)
    (result,) = results
    delivered = [r["step"] for r in sink.items if r["kind"] == "metric"]
    assert delivered == sorted(set(delivered)) and len(delivered) < 40
    assert result.dropped_records > 0
    notices = [
        r
        for r in sink.items
        if r["kind"] == "event" and r["data"].get("code") == "telemetry_dropped"
    ]
    assert (
        notices
        and f"{result.dropped_records} telemetry records dropped" in notices[-1]["data"]["message"]
    )


def test_a_checkpoint_never_gets_ahead_of_the_records_delivered_to_the_sink(tmp_path: Any) -> None:
    """A resumed run never re-runs the steps before its checkpoint, so their records must
    already be with the sink when the checkpoint appears (else a crash right after the
    save loses them for good)."""

    class SlowSink(BatchSink):
        def write(self, items: list[dict[str, Any]]) -> None:
            time.sleep(0.05)  # a sink slower than training: the queue is never empty
            super().write(items)

    sink = SlowSink()
    violations: list[tuple[int, int]] = []

    def check_at_step_boundary() -> None:
        delivered = max((r["step"] for b in sink.metric_batches() for r in b), default=0)
        on_disk = [int(p.stem.split("-")[1]) for p in tmp_path.glob("step-*.pt")]
        violations.extend((s, delivered) for s in on_disk if s > delivered)

    spec_ = spec(
        max_steps=24,
        telemetry={"flush_every_steps": 1, "flush_every_ms": 600_000},
        checkpoint={"every_steps": 6, "keep_last": 10},
    )
    ctx = RunContext(str(tmp_path), sink=sink, should_stop=lambda: check_at_step_boundary())
    Trainer(spec_, ctx).train()
    assert sorted(int(p.stem.split("-")[1]) for p in tmp_path.glob("step-*.pt")) == [6, 12, 18, 24]
    assert violations == []


def read_later_telemetry(spec_: Any, sink: ListSink) -> tuple[StepTelemetry, Publisher, HostReads]:
    """A CPU run's telemetry on the CUDA path (a due flush queues one copy and publishes it a
    flush later): the engine's own seam, whose copies finish by the next flush."""
    publisher = Publisher(sink, spec_.telemetry.queue_size)
    telemetry = StepTelemetry(
        spec_.telemetry,
        torch.device("cpu"),
        publisher,
        with_scaler=False,
        read_later=True,
    )
    assert isinstance(telemetry.host, LateHostReads)
    return telemetry, publisher, telemetry.host


def test_due_flushes_read_the_previous_window_without_waiting_then_all_at_an_explicit_flush() -> (
    None
):
    spec_ = spec(telemetry={"flush_every_steps": 4, "flush_every_ms": 600_000})
    sink = ListSink()
    telemetry, publisher, reads = read_later_telemetry(spec_, sink)
    published: dict[int, list[int]] = {}
    for step in range(1, 11):
        value = torch.tensor(float(step))
        started = time.perf_counter()
        time.sleep(0.002)  # a step of a few ms
        telemetry.record(
            step,
            {"loss": value, "grad_norm": value, "lr": value / 100},
            samples=16,
            started=started,
        )
        assert publisher.wait_delivered(30)
        published[step] = sorted(sink.metrics())
    assert published[1] == [1]  # the first flush reads at once: a watcher sees the start
    assert published[4] == [1]  # steps 2-4 queued, their copy not read: no wait for it
    assert published[8] == [1, 2, 3, 4]  # read at the next due flush, once the copy was done
    assert reads.count == 3  # the first read and two queued copies, nothing per step
    telemetry.flush()  # explicit (an event, a checkpoint, the end): everything, in order
    assert publisher.wait_delivered(30)
    metrics = sink.metrics()
    assert [r["step"] for r in sink.items if r["kind"] == "metric"] == list(range(1, 11))
    assert [metrics[s]["loss"] for s in range(1, 11)] == [float(s) for s in range(1, 11)]
    assert all(metrics[s]["step_time_ms"] >= 2.0 for s in range(2, 11))
    assert reads.count == 4
    publisher.close(5)
