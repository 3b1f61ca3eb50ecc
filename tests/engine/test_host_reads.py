"""Between two telemetry flushes a training step reads no device value on the host.

Counted two ways in the training thread: every call of the engine's own seam
(``StepTelemetry.host``, the one place it brings device values to the host), and every
read of a tensor's value by anyone (``.item()``, ``bool()``, ``float()``, ``torch.equal``
and friends, seen by a dispatch mode; ``.tolist()`` and ``.numpy()``, wrapped). On a GPU
each such read is a host wait that stops the host from running ahead of the device.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from amptrain.contract.records import OVERFLOW_WARNING
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from tests.support.sinks import ListSink

_READ_OPS = {
    torch.ops.aten._local_scalar_dense.default,  # .item(), bool(t), float(t), int(t)
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.allclose.default,
}


class _ReadOps(TorchDispatchMode):
    def __init__(self, reads: list[str]) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _READ_OPS:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


@contextmanager
def host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every host read of a tensor value made by this (the training) thread while active."""
    reads: list[str] = []
    me = threading.current_thread()
    for name in ("tolist", "numpy"):
        original = getattr(torch.Tensor, name)

        def wrapped(
            self: torch.Tensor, *a: Any, _o: Any = original, _n: str = name, **k: Any
        ) -> Any:
            if threading.current_thread() is me:
                reads.append(_n)
            return _o(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    with _ReadOps(reads):
        yield reads
    monkeypatch.undo()


def spec(precision: str, optimizer: str, init_scale: float = 2.0**20, **overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 32}},
            "dataset": {"name": "synthetic-classification", "args": {"features": 16}},
            "max_steps": 40,
            "batch_size": 16,
            "grad_accum_steps": 2,
            "precision": precision,
            "device": "cpu",
            "optimizer": {"name": optimizer},
            "schedule": {"name": "cosine", "warmup_steps": 3},
            # fp16: a scale that overflows at first and grows back after 2 clean steps, so
            # skipped steps (here 1, 2 and 4) and the schedule holding still through them
            # happen in the window.
            "loss_scale": {"init_scale": init_scale, "growth_interval": 2},
            "telemetry": {"flush_every_steps": 6, "flush_every_ms": 600_000},
            **overrides,
        }
    )


@pytest.mark.parametrize(
    ("precision", "optimizer"),
    [("fp32", "adamw"), ("bf16", "adamw"), ("fp16", "adamw"), ("fp16", "sgd")],
)
def test_steps_between_flushes_read_nothing_from_the_device(
    monkeypatch: pytest.MonkeyPatch, precision: str, optimizer: str
) -> None:
    sink = ListSink()
    trainer = Trainer(spec(precision, optimizer), RunContext(None, sink=sink))
    trainer.train_step()  # warm-up: lazy optimizer state
    trainer.telemetry.flush()
    seam = trainer.telemetry.host.count
    with host_reads(monkeypatch) as reads:
        for _ in range(4):  # steps 2..5: the next flush is due at step 6 (a multiple of 6)
            trainer.train_step()
        between_flushes = list(reads)
        seam_between = trainer.telemetry.host.count - seam
        trainer.train_step()  # step 6 flushes steps 2..6
    assert between_flushes == [] and seam_between == 0
    assert trainer.telemetry.host.count == seam + 1 and reads == ["tolist"]
    assert trainer.publisher.wait_delivered(30)
    metrics = sink.metrics()
    assert sorted(metrics) == list(range(1, 7))
    if precision == "fp16":
        skipped = [s for s in range(1, 7) if metrics[s]["skipped"]]
        assert skipped, "no step overflowed: the skip path was not exercised"
        # The device-side schedule held still through the skipped steps.
        for s in skipped:
            if s + 1 in metrics:
                assert metrics[s + 1]["lr"] == metrics[s]["lr"]
    applied = [metrics[s]["lr"] for s in range(1, 7) if not metrics[s]["skipped"]]
    assert applied[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3], rel=1e-6)  # the warm-up


def test_the_counter_sees_the_read_a_plain_optimizer_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: GradScaler with an unfused optimizer reads found_inf every step.
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, foreach=False)
    scaler = torch.amp.GradScaler("cpu")
    with host_reads(monkeypatch) as reads:
        scaler.scale(net(torch.randn(3, 4)).sum()).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    assert "aten._local_scalar_dense.default" in reads


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_evaluation_costs_its_one_read_and_steps_between_read_nothing(
    monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    # Evaluations every 4 steps, flushes every 6: steps 4, 8 and 16 evaluate (the evaluation
    # record forces a flush of their pending steps), 6 and 18 flush, 12 does both (its
    # evaluation's flush finds nothing pending), the rest do neither.
    job = spec(precision, "adamw", eval={"every_steps": 4, "batches": 3})
    trainer = Trainer(job, RunContext(None, sink=ListSink()))
    assert trainer.evaluator is not None, "the synthetic dataset's held-out split is gone"
    trainer.train_step()  # warm-up: lazy optimizer state, the run's first flush
    per_step: dict[int, tuple[list[str], int, bool]] = {}
    with host_reads(monkeypatch) as reads:
        for _ in range(2, 19):
            before, seam = len(reads), trainer.telemetry.host.count
            trainer.train_step()
            trainer._boundary(final=False)  # what train() does after each step
            flushes = trainer.telemetry.host.count - seam
            evaluated = trainer.state.last_eval_step == trainer.step
            per_step[trainer.step] = (reads[before:], flushes, evaluated)
    assert [s for s, (_, _, e) in per_step.items() if e] == [4, 8, 12, 16]
    assert [s for s, (_, n, _) in per_step.items() if n] == [4, 6, 8, 12, 16, 18]
    for step, (read, flushes, evaluated) in per_step.items():
        # One transfer per flush, one .tolist() per evaluation, and nothing else: an .item()
        # (or bool(), float(), ...) anywhere in the step or the evaluation shows up here.
        assert read == ["tolist"] * (flushes + evaluated), (step, read)
    assert len(reads) == sum(n + e for _, n, e in per_step.values()) == 10


def test_a_skipped_steps_attribution_is_read_only_at_the_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink = ListSink()
    # A scale that never overflows on its own: only the injected step 3 is skipped.
    trainer = Trainer(spec("fp16", "adamw", init_scale=256.0), RunContext(None, sink=sink))
    trainer.train_step()
    trainer.telemetry.flush()
    weight = next(p for n, p in trainer.model.named_parameters() if n.endswith("weight"))
    name = next(n for n, p in trainer.model.named_parameters() if p is weight)
    weight.register_hook(lambda g: torch.full_like(g, math.inf) if trainer.step + 1 == 3 else g)
    seam = trainer.telemetry.host.count
    with host_reads(monkeypatch) as reads:
        for _ in range(4):  # steps 2..5, step 3 overflows
            trainer.train_step()
        between_flushes, seam_between = list(reads), trainer.telemetry.host.count - seam
        assert trainer.telemetry.attribution.counts == {}  # not known before the flush
        trainer.train_step()  # step 6 flushes steps 2..6
    assert between_flushes == [] and seam_between == 0
    # The attribution came in the flush's one read, with the step's other values.
    assert trainer.telemetry.host.count == seam + 1 and reads == ["tolist"]
    assert trainer.telemetry.attribution.counts == {name: 1}
    assert trainer.publisher.wait_delivered(30)
    assert [s for s, m in sink.metrics().items() if m["skipped"]] == [3]
    warnings = [e for e in sink.events("warning") if e["data"]["code"] == OVERFLOW_WARNING]
    assert [(w["step"], w["data"]["param"]) for w in warnings] == [(3, name)]
