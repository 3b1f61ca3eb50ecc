"""Per-layer gradient norms (``telemetry.layer_grad_norms_every``): every K steps one
``layer_grad_norm`` record whose values are torch's own per-module gradient norms; off, no
record and no work; on, no host read between flushes and still one read per flush."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch

from amptrain.contract.layers import LAYER_NORMS_MAX, ROOT_LAYER, layer_line, layer_paths
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.layer_norms import LayerValues
from tests.engine.test_host_reads import host_reads
from tests.engine.test_telemetry import read_later_telemetry
from tests.support.sinks import ListSink


def spec(every: int | None, precision: str = "fp32", **overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 32}},
            "dataset": {"name": "synthetic-classification", "args": {"features": 16}},
            "max_steps": 12,
            "batch_size": 16,
            "precision": precision,
            "device": "cpu",
            "grad_clip_norm": None,  # the gradients left in the model are the ones measured
            "telemetry": {
                "flush_every_steps": 4,
                "flush_every_ms": 600_000,
                "layer_grad_norms_every": every,
            },
            **overrides,
        }
    )


def layer_records(sink: ListSink) -> list[dict[str, Any]]:
    return [r for r in sink.items if r["kind"] == "layer_grad_norm"]


def torch_module_norms(model: torch.nn.Module) -> dict[str, float]:
    """Each parameter-holding module's gradient norm, computed directly."""
    out: dict[str, float] = {}
    for name, module in model.named_modules():
        grads = [p.grad for p in module.parameters(recurse=False) if p.grad is not None]
        if grads:
            total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            out[name or ROOT_LAYER] = float(total)
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_kth_step_records_each_layers_norm_as_torch_computes_it(precision: str) -> None:
    sink = ListSink()
    trainer = Trainer(spec(3, precision), RunContext(None, sink=sink))
    expected: dict[int, dict[str, float]] = {}
    for _ in range(9):
        trainer.train_step()
        if trainer.step % 3 == 0:  # the gradients stay in the model until the next step
            expected[trainer.step] = torch_module_norms(trainer.model)
    trainer.telemetry.flush()
    assert trainer.publisher.wait_delivered(30)
    records = layer_records(sink)
    assert [r["step"] for r in records] == [3, 6, 9]
    for record in records:
        want = expected[record["step"]]
        assert list(record["values"]) == list(want)  # net.1, net.2, ... in registration order
        assert record["values"] == pytest.approx(want, rel=1e-5)
        # Each lands right after its step's metric record, with that step's time.
        assert record["time"] == sink.metrics()[record["step"]]["time"]


def test_off_records_nothing() -> None:
    sink = ListSink()
    Trainer(spec(None), RunContext(None, sink=sink)).train()
    assert sorted(sink.metrics()) == list(range(1, 13)) and layer_records(sink) == []


def test_an_overflowing_fp16_step_records_null_norms() -> None:
    sink = ListSink()
    # A scale that overflows at first and grows back after 2 clean steps (test_host_reads').
    overrides = {"loss_scale": {"init_scale": 2.0**20, "growth_interval": 2}, "grad_accum_steps": 2}
    Trainer(spec(1, "fp16", **overrides), RunContext(None, sink=sink)).train()
    metrics = sink.metrics()
    skipped = [s for s in metrics if metrics[s]["skipped"]]
    assert skipped, "no step overflowed"
    by_step = {r["step"]: r["values"] for r in layer_records(sink)}
    assert sorted(by_step) == list(range(1, 13))
    assert any(v is None for s in skipped for v in by_step[s].values())
    clean = [s for s in metrics if not metrics[s]["skipped"]]
    assert clean and all(
        v is not None and math.isfinite(v) for s in clean for v in by_step[s].values()
    )


def test_due_steps_add_no_host_read(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = ListSink()
    trainer = Trainer(spec(1, "fp16"), RunContext(None, sink=sink))  # every step is due
    trainer.train_step()
    trainer.telemetry.flush()
    seam = trainer.telemetry.host.count
    with host_reads(monkeypatch) as reads:
        for _ in range(2):  # steps 2, 3: the next flush is due at step 4
            trainer.train_step()
        between = list(reads)
        trainer.train_step()  # step 4 flushes steps 2..4, their layer norms with them
    assert between == [] and reads == ["tolist"]
    assert trainer.telemetry.host.count == seam + 1
    assert trainer.publisher.wait_delivered(30)
    assert [r["step"] for r in layer_records(sink)] == [1, 2, 3, 4]


def test_a_model_with_too_many_layers_is_grouped_by_shorter_paths() -> None:
    names = [f"blocks.{i}.{part}.weight" for i in range(150) for part in ("attn", "mlp")]
    paths = layer_paths([*names, "head.weight", "scale"])
    assert len(set(paths)) == 152 <= LAYER_NORMS_MAX  # 301 modules would be too many
    assert paths[:3] == ["blocks.0", "blocks.0", "blocks.1"]
    assert paths[-2:] == ["head", ROOT_LAYER]
    few = layer_paths(["blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias"])
    assert few == ["blocks.0.attn.proj", "blocks.0.attn.proj"]


def test_the_option_is_bounded_and_an_error_names_it() -> None:
    for bad in (0, 100_001):
        with pytest.raises(ValueError, match="layer_grad_norms_every"):
            spec(bad)


def test_the_command_lines_print_a_due_steps_extremes() -> None:
    line = layer_line(30, {"net.1": 0.012, "net.4": 0.8, "net.8": None})
    assert line == "layer grad norms step 30 · 3 layers · max net.4 0.8 · min net.1 0.012"
    assert layer_line(2, {"net.1": None}).endswith("n/a")


def test_a_window_read_later_carries_its_layer_norms_in_its_one_copy() -> None:
    """The CUDA path (a due flush queues one copy and publishes it a flush later), here
    with a host that finishes each copy by the next: the layer norms travel in it."""
    sink = ListSink()
    telemetry, publisher, reads = read_later_telemetry(spec(2), sink)
    for step in range(1, 11):
        value = torch.tensor(float(step))
        due = LayerValues(torch.tensor([step, 2.0 * step]), ("a.b", "c")) if step % 2 == 0 else None
        telemetry.record(
            step,
            {"loss": value, "grad_norm": value, "lr": value / 100},
            samples=16,
            started=time.perf_counter(),
            layers=due,
        )
    telemetry.flush()
    assert publisher.wait_delivered(30)
    assert reads.count == 4  # the first read, two queued copies and the explicit flush
    assert [(r["step"], r["values"]) for r in layer_records(sink)] == [
        (s, {"a.b": float(s), "c": 2.0 * s}) for s in range(2, 11, 2)
    ]
    assert [r["step"] for r in sink.items if r["kind"] == "metric"] == list(range(1, 11))
    publisher.close(5)
