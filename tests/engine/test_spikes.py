"""Loss spikes (``health.spike``): found on the device with no host read, then warned about
or skipped like an fp16 overflow step."""

from __future__ import annotations

import collections
import itertools
import math
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
import torch.nn.functional as F

from amptrain.contract.errors import PreemptedError
from amptrain.contract.records import SPIKE_WARNING
from amptrain.contract.spec import parse_spec
from amptrain.engine import Components, RunContext, Trainer, parts
from amptrain.engine.spikes import HostSpikeCheck, SpikeCheck
from tests.engine import test_amp
from tests.engine.test_amp import OomOnce, TinyData, TinyNet, _oom_in_optimizer_step_once
from tests.engine.test_host_reads import host_reads
from tests.support.sinks import ListSink

pytestmark = pytest.mark.usefixtures("read_mode")

K = 30  # the step whose batch spikes


class SpikyData(TinyData):
    """TinyData with the batches (batch size 8) of the steps ``at`` scaled by 1e3."""

    def __init__(self, at: tuple[int, ...] = (K,)) -> None:
        self.at = at

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().batch(start, size)
        return (x * 1e3 if start // 8 + 1 in self.at else x), y


def spec(spike: dict[str, Any] | None, **overrides: Any) -> Any:
    health = {"health": {"spike": {"window": 16, "warmup_steps": 8, **spike}}} if spike else {}
    return parse_spec(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic-classification"},
            "max_steps": 40,
            "batch_size": 8,
            "device": "cpu",
            "grad_clip_norm": None,
            "telemetry": {"flush_every_steps": 10, "flush_every_ms": 600_000},
            **health,
            **overrides,
        }
    )


def trainer(
    job: Any, sink: ListSink, ctx: RunContext | None = None, at: tuple[int, ...] = (K,)
) -> Trainer:
    """A Trainer of ``job`` on TinyNet and :class:`SpikyData` spiking at the steps ``at``."""
    torch.manual_seed(0)
    ctx = ctx or RunContext(None, sink=sink)
    return Trainer(job, ctx, Components(TinyNet(), SpikyData(at), F.cross_entropy))


def weights(t: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.model.parameters()]


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_skip_leaves_the_weights_of_a_run_that_never_applied_that_batch(optimizer: str) -> None:
    sink = ListSink()
    skipping = trainer(spec({"action": "skip"}, optimizer={"name": optimizer}), sink)
    skipping.train()
    # The reference, by hand: no spike check; at step K the optimizer step and the schedule's
    # advance are simply not called.
    ref = trainer(spec(None, optimizer={"name": optimizer}), ListSink())
    step, advance = ref.optimizer.step, ref.schedule.advance
    ref.optimizer.step = lambda *a, **k: None if ref.step + 1 == K else step(*a, **k)  # type: ignore[method-assign]
    ref.schedule.advance = lambda f: None if ref.step + 1 == K else advance(f)  # type: ignore[method-assign]
    ref.train()
    for a, b in zip(weights(skipping), weights(ref), strict=True):
        assert torch.equal(a, b)
    # And the check did change something: without it the batch's update is applied.
    plain = trainer(spec(None, optimizer={"name": optimizer}), ListSink())
    plain.train()
    assert not all(torch.equal(a, b) for a, b in zip(weights(plain), weights(ref), strict=True))
    assert skipping.publisher.wait_delivered(30)
    metrics = sink.metrics()
    assert [s for s, m in metrics.items() if m["skipped"]] == [K]
    assert metrics[K + 1]["lr"] == metrics[K]["lr"]  # the schedule held still
    warnings = [e for e in sink.events("warning") if e["data"]["code"] == SPIKE_WARNING]
    assert [(w["step"], w["data"]["action"]) for w in warnings] == [(K, "skip")]
    assert warnings[0]["data"]["value"] == pytest.approx(metrics[K]["loss"])


def test_warn_only_warns() -> None:
    sink = ListSink()
    warned = trainer(spec({"action": "warn"}), sink)
    warned.train()
    plain = trainer(spec(None), ListSink())
    plain.train()
    for a, b in zip(weights(warned), weights(plain), strict=True):
        assert torch.equal(a, b)
    assert warned.publisher.wait_delivered(30)
    assert not any(m["skipped"] for m in sink.metrics().values())
    warnings = [e for e in sink.events("warning") if e["data"]["code"] == SPIKE_WARNING]
    assert [w["step"] for w in warnings] == [K]
    data = warnings[0]["data"]
    assert data["value"] - data["mean"] > data["z"] * data["std"]


def test_fp16_skip_keeps_the_loss_scale() -> None:
    sink = ListSink()
    # A scale that never overflows this model: only the spike withholds an update.
    t = trainer(spec({"action": "skip"}, precision="fp16", loss_scale={"init_scale": 1.0}), sink)
    t.train()
    assert t.publisher.wait_delivered(30)
    metrics = sink.metrics()
    assert [s for s, m in metrics.items() if m["skipped"]] == [K]
    assert metrics[K + 1]["loss_scale"] == metrics[K]["loss_scale"]  # not backed off
    assert metrics[K + 1]["lr"] == metrics[K]["lr"]


def test_the_check_reads_nothing_between_flushes(
    monkeypatch: pytest.MonkeyPatch, read_mode: str
) -> None:
    # The tensor rule, which a GPU runs (a CPU run takes the scalar one: nothing to wait for
    # there); proven here on the CPU, the only device CI has.
    monkeypatch.setattr(parts, "spike_check", SpikeCheck)
    t = trainer(spec({"action": "skip", "metric": "grad_norm"}), ListSink())
    assert type(t.amp.spike) is SpikeCheck
    t.train_step()
    t.telemetry.flush()
    seam = t.telemetry.host.count
    with host_reads(monkeypatch) as reads:
        for _ in range(8):  # steps 2..9: the next flush is due at step 10
            t.train_step()
        between, seam_between = list(reads), t.telemetry.host.count - seam
        t.train_step()
    assert between == [] and seam_between == 0
    # One transfer at the due flush: read at once, or (one GPU) a copy queued, read a flush later.
    assert t.telemetry.host.count == seam + 1
    assert reads == (["tolist"] if read_mode == "at_once" else [])


def test_the_rule_is_bounded_and_errors_name_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="warmup_steps"):
        spec({"window": 8, "warmup_steps": 9})
    with pytest.raises(pydantic.ValidationError, match="window"):
        spec({"window": 4})
    with pytest.raises(pydantic.ValidationError, match="devices 1"):
        spec({"action": "warn"}, devices=2)
    with pytest.raises(pydantic.ValidationError, match="max_rollbacks"):
        spec({"action": "rollback", "max_rollbacks": 101})
    # A rollback needs a checkpoint before the end to go back to.
    with pytest.raises(pydantic.ValidationError, match=r"checkpoint\.every_steps"):
        spec({"action": "rollback"}, checkpoint={"every_steps": 40})
    spec({"action": "rollback"}, checkpoint={"every_steps": 39})


def test_a_resumed_run_keeps_the_window_and_skips_the_same_step(tmp_path: Path) -> None:
    """Preempted at step 25 (the window already warm), resumed: step K is judged against the
    same window, so the run ends bitwise where an uninterrupted one does."""
    job = spec({"action": "skip"}, checkpoint={"every_steps": 1000})
    straight = trainer(job, ListSink())
    straight.train()
    ref: list[Trainer] = []
    stop = lambda: "preempt" if ref and ref[0].step == 25 else None  # noqa: E731
    first = trainer(job, ListSink(), RunContext(str(tmp_path), should_stop=stop))
    ref.append(first)
    with pytest.raises(PreemptedError):
        first.train()
    sink = ListSink()
    second = trainer(job, sink, RunContext(str(tmp_path), sink=sink))
    assert second.train().resumed_from == 25
    for a, b in zip(weights(straight), weights(second), strict=True):
        assert torch.equal(a, b)
    assert second.publisher.wait_delivered(30)
    assert [s for s, m in sink.metrics().items() if m["skipped"]] == [K]


def spiky_values() -> list[float]:
    """3000 values that barely vary (2.0 +- 1e-4), a spike every 97, NaN and infinities."""
    gen = torch.Generator().manual_seed(0)
    values = (2.0 + 1e-4 * torch.randn(3000, generator=gen)).tolist()
    for i in range(50, 3000, 97):
        values[i] += 0.5  # a spike
    values[500], values[1500], values[2500] = math.nan, math.inf, -math.inf
    return values


@pytest.mark.parametrize("rule_class", [SpikeCheck, HostSpikeCheck])
def test_the_running_statistics_equal_the_window_s_own_after_many_wraps(
    rule_class: type[SpikeCheck],
) -> None:
    """Thousands of values through a window of 16 (over a hundred wraps, with spikes and
    non-finite values left out): each step's mean, std and flag are those of the last 16
    accepted values, computed directly, even where the values barely vary (2.0 +- 1e-4)."""
    rule = spec({"action": "skip"}).health.spike  # window 16, warm-up 8
    check = rule_class(rule, torch.device("cpu"))
    values = spiky_values()
    window: collections.deque[float] = collections.deque(maxlen=rule.window)
    spikes = 0
    for v in values:
        flag = check.check(torch.tensor(v, dtype=torch.float32))
        held = torch.tensor(list(window), dtype=torch.float64)
        x = float(torch.tensor(v, dtype=torch.float32))  # what the window holds
        mean = float(held.mean()) if window else 0.0
        std = float(held.std(correction=0)) if window else 0.0
        assert float(flag.mean) == pytest.approx(mean, rel=1e-12, abs=1e-12)
        assert float(flag.std) == pytest.approx(std, rel=1e-6, abs=1e-12)
        spike = len(window) >= rule.warmup_steps and math.isfinite(x) and x - mean > rule.z * std
        assert bool(flag.spike) == spike
        spikes += spike
        if math.isfinite(x) and not spike:
            window.append(x)
    assert spikes == len(range(50, 3000, 97))


def test_the_cpus_scalar_rule_flags_what_the_tensor_rule_flags() -> None:
    """The same flags, means and window state, bit for bit; the std to 1e-12 (torch's CPU
    sqrt of a double can differ from IEEE's correctly rounded one in the last bits)."""
    rule = spec({"action": "skip"}).health.spike
    tensors, scalars = (
        SpikeCheck(rule, torch.device("cpu")),
        HostSpikeCheck(rule, torch.device("cpu")),
    )
    for v in spiky_values():
        x = torch.tensor(v, dtype=torch.float32)
        a, b = tensors.check(x), scalars.check(x)
        assert (float(a.spike), float(a.mean)) == (float(b.spike), float(b.mean))
        assert float(a.std) == pytest.approx(float(b.std), rel=1e-12, abs=1e-300)
    one, other = tensors.state_dict(), scalars.state_dict()
    assert torch.equal(one.pop("rows"), other.pop("rows"))  # a checkpoint reads the same
    assert torch.equal(one.pop("sums"), other.pop("sums")) and one == other


def _same_window(one: dict[str, Any], other: dict[str, Any]) -> None:
    """Two windows' state_dicts are equal, bit for bit."""
    one, other = dict(one), dict(other)
    assert torch.equal(one.pop("rows"), other.pop("rows"))
    assert torch.equal(one.pop("sums"), other.pop("sums")) and one == other


@pytest.mark.parametrize("rule_class", [SpikeCheck, HostSpikeCheck])
def test_an_undone_check_leaves_the_window_bit_for_bit_as_it_was(
    rule_class: type[SpikeCheck],
) -> None:
    """Checks undone in the warm-up (a huge value, accepted: adding and subtracting it would
    not give the sums back), at the checks that sum the rows afresh, after the warm-up (a
    spike, and accepted values, one just before a real spike): the flags and the window are
    those of a run that never made them."""
    rule = spec({"action": "skip"}).health.spike  # window 16, warm-up 8
    once, retried = rule_class(rule, torch.device("cpu")), rule_class(rule, torch.device("cpu"))
    # By the index of the value it is undone before; the 16th and 32nd checks sum afresh.
    undone = {3: 3.3e7, 15: 3.3e7, 20: 2.5, 31: 2.0, 50: 2.0}
    flagged = []
    for i, v in enumerate(spiky_values()[:60]):
        x = torch.tensor(v, dtype=torch.float32)
        a = once.check(x)
        if i in undone:
            retried.check(torch.tensor(undone[i], dtype=torch.float32))
            retried.undo()
        b = retried.check(x)
        assert (float(a.spike), float(a.mean), float(a.std)) == (
            float(b.spike),
            float(b.mean),
            float(b.std),
        )
        _same_window(once.state_dict(), retried.state_dict())
        flagged += [i] if a.spike else []
    assert flagged == [50] and once.state_dict()["count"] == 59  # the spike left out


@pytest.mark.parametrize("rule_class", [SpikeCheck, HostSpikeCheck])
def test_an_oom_in_the_optimizer_step_leaves_one_check_of_the_retried_step(
    rule_class: type[SpikeCheck], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OOM comes after the step's spike check ran; the retried step (at half the
    micro-batch) checks its loss again. Its window is that of a run whose OOM came in the
    forward, before any check: the same losses, each in the window once."""
    monkeypatch.setattr(parts, "spike_check", rule_class)  # the tensor rule too, on the CPU
    health = {"spike": {"window": 16, "warmup_steps": 8, "action": "skip"}}
    job = test_amp.spec(batch_size=16, auto_micro_batch=True, health=health)
    in_forward = Trainer(job, RunContext(None), test_amp.components(OomOnce))
    assert isinstance(in_forward.model, OomOnce)
    in_forward.model.trainer = in_forward
    in_forward.train()
    in_step = Trainer(job, RunContext(None), test_amp.components())
    _oom_in_optimizer_step_once(in_step, at=3)
    in_step.train()
    assert (in_step.state.micro_batch, in_step.step) == (
        8,
        6,
    )  # the OOM did happen, and was retried
    windows = [t.amp.spike for t in (in_forward, in_step)]
    assert all(type(w) is rule_class for w in windows)
    one, other = (w.state_dict() for w in windows if w is not None)
    assert (one["count"], one["checks"]) == (6, 6)  # warming up: every loss accepted
    _same_window(one, other)


def test_a_flush_sends_one_warning_for_all_its_spikes() -> None:
    """Issue 37: ``z: 1e-6`` flags about every step above the window's mean; each was a
    warning of its own (968 in 1,000 steps). Now each flush's spikes are one warning with
    their ``count`` and ``first_step``/``last_step``, carrying the first one's values."""
    sink = ListSink()
    rule = {"z": 1e-6, "window": 8, "warmup_steps": 2, "action": "skip"}
    t = trainer(spec(rule, max_steps=100), sink)
    t.train()
    assert t.publisher.wait_delivered(30)
    skipped = [s for s, m in sink.metrics().items() if m["skipped"]]
    warnings = [e for e in sink.events("warning") if e["data"]["code"] == SPIKE_WARNING]
    assert len(skipped) > 20  # the rule does flag many steps
    assert len(warnings) <= 100 // 10 + 1  # at most one a flush (every 10 steps)
    assert sum(w["data"]["count"] for w in warnings) == len(skipped)
    spans = [(w["data"]["first_step"], w["data"]["last_step"]) for w in warnings]
    assert [w["step"] for w in warnings] == [first for first, _ in spans]
    assert all(a <= b < c for (a, b), (c, _) in itertools.pairwise(spans))
    assert spans[0][0] == skipped[0] and spans[-1][1] == skipped[-1]
    assert warnings[0]["data"]["value"] == pytest.approx(sink.metrics()[skipped[0]]["loss"])
