"""``health.spike.action: rollback``: the spike's update withheld on the device, then, once a
flush has read it, back to the newest checkpoint at or before it, its step count kept (the
batches since are skipped), in-process, on the real engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from amptrain.contract.errors import DivergedError, PreemptedError
from amptrain.contract.layout import checkpoint_name
from amptrain.contract.records import ROLLBACK_EVENT
from amptrain.engine import Components, RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from tests.engine.test_amp import TinyData, TinyNet
from tests.engine.test_spikes import SpikyData, spec, trainer, weights
from tests.support.sinks import ListSink

pytestmark = pytest.mark.usefixtures("read_mode")

SPIKE = 25  # the step whose batch spikes; the flush of step 30 reads it (one GPU: of 40)
MAX_STEPS = 60


def read_at(read_mode: str) -> int:
    """The step whose flush reads the spike of step 25 and rolls back (flushes every 10):
    30, or 40 where a due flush reads the window before the newest (one GPU)."""
    return 30 if read_mode == "at_once" else 40


def job(**spike: Any) -> Any:
    return spec(
        {"action": "rollback", **spike},
        max_steps=MAX_STEPS,
        checkpoint={"every_steps": 20, "keep_last": 10},
    )


def rollbacks(sink: ListSink) -> list[dict[str, Any]]:
    return sink.events(ROLLBACK_EVENT)


def test_a_spike_rolls_back_to_the_checkpoint_before_it_and_skips_the_batches_since(
    tmp_path: Path, read_mode: str
) -> None:
    at = read_at(read_mode)
    sink = ListSink()
    t = trainer(job(), sink, RunContext(str(tmp_path), sink=sink), at=(SPIKE,))
    assert t.train().final_step == MAX_STEPS
    assert t.publisher.wait_delivered(30)
    (event,) = rollbacks(sink)
    assert event["step"] == at  # where the flush read it and the run went on from
    data = event["data"]
    assert (data["spike_step"], data["from_step"]) == (SPIKE, 20)
    assert data["name"] == checkpoint_name(20) and "/" not in data["name"]
    assert (data["samples_from"], data["samples_to"]) == (20 * 8, at * 8)
    assert "rolled back" in data["message"] and str(SPIKE) in data["message"]
    # Every step recorded once, in order; the spike's own update withheld.
    steps = [r["step"] for r in sink.items if r["kind"] == "metric"]
    assert steps == list(range(1, MAX_STEPS + 1))
    assert [s for s, m in sink.metrics().items() if m["skipped"]] == [SPIKE]
    # The state written right after the rollback is the checkpoint's of step 20.
    store = CheckpointStore(str(tmp_path), keep_last=10)
    before, after = (store.load(store.path(checkpoint_name(s))) for s in (20, at))
    for name, tensor in before["model"].items():
        assert torch.equal(after["model"][name], tensor), name
    assert after["scheduler"] == before["scheduler"]
    assert after["step"] == at and after["samples_consumed"] == at * 8
    assert after["rollbacks"] == 1
    # And it changed the run: skipping the spike alone ends elsewhere.
    skipped = trainer(job(action="skip"), ListSink(), at=(SPIKE,))
    skipped.train()
    assert not all(torch.equal(a, b) for a, b in zip(weights(t), weights(skipped), strict=True))


def test_a_run_killed_after_a_rollback_resumes_exactly(tmp_path: Path, read_mode: str) -> None:
    killed_at = read_at(read_mode) + 5
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    straight = trainer(job(), ListSink(), RunContext(str(straight_dir)), at=(SPIKE,))
    straight.train()
    assert straight.state.rollbacks == 1
    ref: list[Trainer] = []
    stop = lambda: "preempt" if ref and ref[0].step == killed_at else None  # noqa: E731
    first = trainer(job(), ListSink(), RunContext(str(killed_dir), should_stop=stop), at=(SPIKE,))
    ref.append(first)
    with pytest.raises(PreemptedError):
        first.train()
    sink = ListSink()
    second = trainer(job(), sink, RunContext(str(killed_dir), sink=sink), at=(SPIKE,))
    assert second.train().resumed_from == killed_at
    for a, b in zip(weights(straight), weights(second), strict=True):
        assert torch.equal(a, b)
    assert second.publisher.wait_delivered(30)
    assert rollbacks(sink) == []  # rolled back once, by the first attempt
    assert second.state.rollbacks == 1


def test_without_a_checkpoint_the_spike_is_skipped_and_the_event_says_so() -> None:
    sink = ListSink()
    rolled = trainer(job(), sink, at=(SPIKE,))  # no checkpoint directory
    rolled.train()
    skipped = trainer(job(action="skip"), ListSink(), at=(SPIKE,))
    skipped.train()
    for a, b in zip(weights(rolled), weights(skipped), strict=True):
        assert torch.equal(a, b)
    assert rolled.publisher.wait_delivered(30)
    (event,) = rollbacks(sink)
    assert event["data"]["name"] is None and event["data"]["from_step"] is None
    assert "no checkpoint directory" in event["data"]["message"]
    assert "skipped" in event["data"]["message"]


def test_past_max_rollbacks_the_job_fails_naming_the_step(tmp_path: Path) -> None:
    sink = ListSink()
    t = trainer(job(max_rollbacks=1), sink, RunContext(str(tmp_path), sink=sink), at=(25, 55))
    with pytest.raises(DivergedError, match="max_rollbacks 1") as failure:
        t.train()
    assert failure.value.step == 60  # the last flush read the spike of step 55
    assert "spike at step 55" in failure.value.message
    assert max(sink.metrics()) == 60
    assert t.publisher.wait_delivered(30)
    assert [e["data"]["spike_step"] for e in rollbacks(sink)] == [25]


def test_a_spike_read_by_the_last_flush_rolls_back_too(tmp_path: Path) -> None:
    """The flush of the last step reads a spike at step 55: the run rolls back to step 40's
    checkpoint and ends with its weights (steps 41-60's batches skipped), checkpointed once at 60."""
    sink = ListSink()
    t = trainer(job(), sink, RunContext(str(tmp_path), sink=sink), at=(55,))
    assert t.train().final_step == MAX_STEPS
    assert t.publisher.wait_delivered(30)
    ((event,),) = [rollbacks(sink)]
    assert (event["step"], event["data"]["from_step"]) == (MAX_STEPS, 40)
    store = CheckpointStore(str(tmp_path), keep_last=10)
    at_40 = store.load(store.path(checkpoint_name(40)))["model"]
    for name, tensor in t.model.state_dict().items():
        assert torch.equal(tensor, at_40[name]), name
    assert [e["step"] for e in sink.events("checkpoint")].count(MAX_STEPS) == 1


def test_fp16_rolls_the_loss_scale_back_too(tmp_path: Path, read_mode: str) -> None:
    at = read_at(read_mode)
    sink = ListSink()
    fp16 = spec(
        {"action": "rollback"},
        max_steps=MAX_STEPS,
        checkpoint={"every_steps": 20, "keep_last": 10},
        precision="fp16",
        loss_scale={"init_scale": 1.0, "growth_interval": 4},  # grows between 20 and 30
    )
    t = trainer(fp16, sink, RunContext(str(tmp_path), sink=sink), at=(SPIKE,))
    assert t.train().final_step == MAX_STEPS
    store = CheckpointStore(str(tmp_path), keep_last=10)
    before, after = (store.load(store.path(checkpoint_name(s))) for s in (20, at))
    assert after["scaler"] == before["scaler"]
    assert t.publisher.wait_delivered(30)
    metrics = sink.metrics()
    scale = before["scaler"]["scale"]
    assert metrics[at + 1]["loss_scale"] == scale != metrics[at]["loss_scale"]


class SpikyWithHeldOut(SpikyData):
    def held_out(self) -> TinyData:
        return TinyData()


def test_an_evaluation_due_at_the_rollback_step_evaluates_the_rolled_back_model(
    tmp_path: Path,
) -> None:
    """Step 30's flush reads the spike before step 30's evaluation ran: it runs after the
    rollback, on the model of step 20's checkpoint, so it equals step 20's evaluation."""
    sink = ListSink()
    torch.manual_seed(0)
    parts = Components(TinyNet(), SpikyWithHeldOut((SPIKE,)), F.cross_entropy)
    evaluated = spec(
        {"action": "rollback"},
        max_steps=MAX_STEPS,
        checkpoint={"every_steps": 20, "keep_last": 10},
        eval={"every_steps": 10, "batches": 2},
    )
    t = Trainer(evaluated, RunContext(str(tmp_path), sink=sink), parts)
    t.train()
    assert t.publisher.wait_delivered(30)
    evals = [r for r in sink.items if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [10, 20, 30, 40, 50, 60]
    by_step = {e["step"]: e["values"] for e in evals}
    assert by_step[30] == by_step[20] and by_step[40] != by_step[30]


def test_a_second_spike_read_while_rolling_back_is_covered_by_that_rollback(
    tmp_path: Path, read_mode: str
) -> None:
    """Spikes at 22 and 27, flushes every 5, checkpoints every 20. On one GPU the flush of
    step 30 reads 21-25 (spike 22) and rolls back; the rollback's own flush then reads 26-30
    (spike 27, trained on the weights just thrown away): it asks for no rollback of its own
    (this raised out of train() as RollbackRequested, and every retry failed alike). Read at
    once, 22 rolls back at 25, and 27, on the rolled-back weights, at 30."""
    sink = ListSink()
    flushed_every_5 = spec(
        {"action": "rollback"},
        max_steps=MAX_STEPS,
        checkpoint={"every_steps": 20, "keep_last": 10},
        telemetry={"flush_every_steps": 5, "flush_every_ms": 600_000},
    )
    t = trainer(flushed_every_5, sink, RunContext(str(tmp_path), sink=sink), at=(22, 27))
    assert t.train().final_step == MAX_STEPS
    assert t.publisher.wait_delivered(30)
    taken = [(e["step"], e["data"]["spike_step"], e["data"]["from_step"]) for e in rollbacks(sink)]
    if read_mode == "at_once":
        assert taken == [(25, 22, 20), (30, 27, 25)]
    else:
        assert taken == [(30, 22, 20)]
    assert t.state.rollbacks == len(taken)
    steps = [r["step"] for r in sink.items if r["kind"] == "metric"]
    assert steps == list(range(1, MAX_STEPS + 1))  # every step once, none after the end
    warned = [e["step"] for e in sink.events("warning") if e["data"]["code"] == "loss_spike"]
    assert warned == [22, 27]


def test_an_evaluation_never_reports_weights_a_rollback_read_later_throws_away(
    tmp_path: Path,
) -> None:
    """Evaluations every 5 steps, flushes every 10, a spike at 25: the evaluation of step 25
    ran before the flush that read the spike, on the weights the rollback (to step 20's
    checkpoint) then threw away, and was not run again. Every step is judged before an
    evaluation now: step 25's evaluation is of the rolled-back model, equal to step 20's."""
    sink = ListSink()
    torch.manual_seed(0)
    parts = Components(TinyNet(), SpikyWithHeldOut((SPIKE,)), F.cross_entropy)
    evaluated = spec(
        {"action": "rollback"},
        max_steps=40,
        checkpoint={"every_steps": 20, "keep_last": 10},
        eval={"every_steps": 5, "batches": 2},
    )
    t = Trainer(evaluated, RunContext(str(tmp_path), sink=sink), parts)
    t.train()
    assert t.publisher.wait_delivered(30)
    (event,) = rollbacks(sink)
    assert (event["step"], event["data"]["from_step"]) == (SPIKE, 20)
    evals = {r["step"]: r["values"] for r in sink.items if r["kind"] == "eval"}
    assert sorted(evals) == [5, 10, 15, 20, 25, 30, 35, 40]
    assert evals[25] == evals[20] and evals[30] != evals[25]
