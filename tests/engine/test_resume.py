"""Checkpoints: exact resume, only of the format this engine writes, atomic writes that survive
SIGKILL, keep_last, newest-wins."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.contract.errors import PreemptedError, ResumeMismatchError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CHECKPOINT_FORMAT, CheckpointMeta, CheckpointStore
from tests.support.sinks import ListSink
from tests.support.stack import wait_until


def spec(precision: str, **overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {
                "name": "mlp",
                "args": {"width": 32, "dropout": 0.1},
            },  # dropout: RNG state matters
            "dataset": {
                "name": "synthetic-classification",
                "args": {"features": 16, "num_samples": 256},
            },
            "max_steps": 12,
            "batch_size": 16,
            "grad_accum_steps": 2,
            "precision": precision,
            "device": "cpu",
            "schedule": {"name": "cosine", "warmup_steps": 2},
            # fp16: an absurd initial scale forces early overflow skips and a short growth
            # interval makes the scale grow again, so the scaler's state must round-trip.
            "loss_scale": {"init_scale": 2.0**24, "growth_interval": 3},
            "checkpoint": {"every_steps": 4, "keep_last": 2},
            **overrides,
        }
    )


def stop_at(step: int, trainer_ref: list[Trainer]) -> Any:
    return lambda: "preempt" if trainer_ref and trainer_ref[0].step == step else None


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_resume_is_bitwise_exact(tmp_path: Path, precision: str) -> None:
    straight = Trainer(spec(precision), RunContext(str(tmp_path / "straight")))
    straight_result = straight.train()

    ref: list[Trainer] = []
    first = Trainer(
        spec(precision), RunContext(str(tmp_path / "split"), should_stop=stop_at(6, ref))
    )
    ref.append(first)
    with pytest.raises(PreemptedError) as info:
        first.train()
    assert info.value.step == 6

    second = Trainer(spec(precision), RunContext(str(tmp_path / "split")))
    result = second.train()
    assert (result.resumed_from, result.final_step) == (6, 12)
    assert result.precision.effective == precision
    for (name, a), (_, b) in zip(
        straight.model.named_parameters(), second.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    assert straight.schedule.state_dict() == second.schedule.state_dict()
    assert torch.equal(straight.schedule.lr, second.schedule.lr)
    if precision == "fp16":
        assert straight_result.skipped_steps > 0  # the scaler really had state to carry over
        assert straight.amp.scaler.state_dict() == second.amp.scaler.state_dict()  # type: ignore[union-attr]


def checkpoint_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".pt"))


def test_keep_last_and_newest_wins(tmp_path: Path) -> None:
    Trainer(
        spec("fp32", max_steps=10, checkpoint={"every_steps": 3, "keep_last": 2}),
        RunContext(str(tmp_path)),
    ).train()
    assert checkpoint_files(tmp_path) == ["step-000000009.pt", "step-000000010.pt"]
    store = CheckpointStore(str(tmp_path), keep_last=2)
    latest = store.latest()
    assert latest is not None and latest.endswith("step-000000010.pt")
    state = store.load(latest)  # weights_only=True inside
    assert (state["step"], state["samples_consumed"]) == (10, 160)
    assert (state["micro_batch"], state["grad_accum_steps"]) == (8, 2)
    assert set(state["rng"]) >= {"python", "numpy", "torch"}


def test_a_resumed_run_starts_only_where_the_checkpoints_writer_recorded_through(
    tmp_path: Path,
) -> None:
    def stopped(attempt: int, at: int, recorded: dict[int, int] | None) -> Trainer:
        ref: list[Trainer] = []
        ctx = RunContext(str(tmp_path), attempt=attempt, recorded=recorded)
        ctx.should_stop = stop_at(at, ref)
        ref.append(Trainer(spec("fp32", max_steps=20), ctx))
        with pytest.raises(PreemptedError):
            ref[0].train()
        return ref[0]

    # Attempt 1 checkpoints at 4, 8 and 10; its history reached SQL up to step 9 only, so
    # attempt 2 resumes from 8 (not 10, which it removes). It stops at 14 with its
    # checkpoints at 12 and 14 (keep_last 2), none of its history recorded.
    assert stopped(1, 10, None).state.resumed_from is None
    assert stopped(2, 14, {1: 9}).state.resumed_from == 8
    # So attempt 3 trusts neither and starts afresh; it stops at 6 (checkpoints 4 and 6).
    assert stopped(3, 6, {1: 9}).state.resumed_from is None
    assert checkpoint_files(tmp_path) == ["step-000000004.pt", "step-000000006.pt"]

    # Attempt 3 recorded through 4. Attempt 1's history reaches 9, but it says nothing of
    # attempt 3's checkpoint at 6 (the newest step of *any* attempt would accept it and
    # leave steps 5-6 of this lineage unrecorded): the run resumes from 4 and re-records
    # every later step.
    sink = ListSink()
    ctx = RunContext(str(tmp_path), sink=sink, attempt=4, recorded={1: 9, 3: 4})
    assert Trainer(spec("fp32", max_steps=20), ctx).train().resumed_from == 4
    assert sorted(sink.metrics()) == list(range(5, 21))
    assert checkpoint_files(tmp_path) == ["step-000000016.pt", "step-000000020.pt"]
    state = CheckpointStore(str(tmp_path), keep_last=2).load(str(tmp_path / "step-000000020.pt"))
    assert state["attempt"] == 4


def test_only_the_checkpoint_format_this_engine_writes_resumes(tmp_path: Path) -> None:
    trained = Trainer(spec("fp32", max_steps=4), RunContext(str(tmp_path)))
    trained.train()
    store = CheckpointStore(str(tmp_path), keep_last=2)
    latest = store.latest()
    assert latest is not None
    state = store.load(latest)
    assert state["format"] == CHECKPOINT_FORMAT
    fresh = Trainer(spec("fp32", max_steps=4), RunContext(None))
    fresh.run_state.load_state_dict(state)
    assert torch.equal(fresh.schedule.lr, trained.schedule.lr)
    assert all(g["lr"] is fresh.schedule.lr for g in fresh.optimizer.param_groups)

    # Any other format (here one whose schedule is a LambdaLR state) is refused by name,
    # for good, before any of it is read.
    state["format"] = 1
    state["scheduler"] = {"last_epoch": 4, "base_lrs": [0.05], "_step_count": 5}
    store.save(4, state, CheckpointMeta(4, healthy=True, attempt=1))
    with pytest.raises(ResumeMismatchError) as refused:
        Trainer(spec("fp32", max_steps=8), RunContext(str(tmp_path))).train()
    assert f"is of format 1 and this engine reads format {CHECKPOINT_FORMAT} only" in (
        refused.value.message
    )
    assert refused.value.step == 4 and refused.value.code == "resume_mismatch"
    assert not refused.value.retryable


def test_cancel_checkpoints_and_a_fresh_context_can_skip_resume(tmp_path: Path) -> None:
    ref: list[Trainer] = []
    trainer = Trainer(
        spec("fp32"),
        RunContext(str(tmp_path), should_stop=lambda: "cancel" if ref[0].step == 5 else None),
    )
    ref.append(trainer)
    with pytest.raises(Exception, match="cancelled at step 5"):
        trainer.train()
    assert "step-000000005.pt" in os.listdir(tmp_path)
    fresh = Trainer(spec("fp32", max_steps=2), RunContext(str(tmp_path), resume=False))
    assert fresh.train().resumed_from is None


_SAVER = textwrap.dedent(
    """
    import os, sys, torch
    from amptrain.engine.checkpoint import CheckpointMeta, CheckpointStore
    if sys.argv[2] == "hold":  # stop before each rename until the parent says go
        rename = os.replace
        def held(src, dst):
            print("renaming", flush=True)
            sys.stdin.readline()
            rename(src, dst)
        os.replace = held
    store = CheckpointStore(sys.argv[1], keep_last=3)
    step = 0
    while True:
        step += 1
        state = {"step": step, "w": torch.full((4_000_000,), float(step))}
        store.save(step, state, CheckpointMeta(step, healthy=True, attempt=1))
        print(step, flush=True)
    """
)


def _kill_inside_a_save(directory: Path, trial: int) -> None:
    """Kill a saver once a save is under way: trials 0-3 the moment a temporary appears
    (while its bytes are written or synced), the last one held just before its rename, so
    at least one kill provably lands inside a save."""
    hold = trial == 4
    child = subprocess.Popen(
        [sys.executable, "-c", _SAVER, str(directory), "hold" if hold else "run"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    completed = 0
    while completed < 2 + trial:  # a few complete saves first
        line = child.stdout.readline()
        assert line, "saver died"
        if line.strip() == "renaming":
            child.stdin.write("\n")
            child.stdin.flush()
        else:
            completed += 1
    if hold:
        assert child.stdout.readline().strip() == "renaming"
    else:
        wait_until(
            lambda: any(n.startswith(".tmp-") for n in os.listdir(directory)),
            30,
            "a save to start",
            interval=0.0005,
        )
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)


@pytest.mark.heavy
def test_a_checkpoint_is_never_half_written_when_the_writer_is_killed(tmp_path: Path) -> None:
    torn_writes = 0
    for trial in range(5):
        directory = tmp_path / f"trial{trial}"
        _kill_inside_a_save(directory, trial)
        names = os.listdir(directory)
        torn_writes += any(n.startswith(".tmp-") for n in names)
        complete = [n for n in names if n.startswith("step-") and n.endswith(".pt")]
        assert complete, names
        for name in complete:
            state = torch.load(directory / name, weights_only=True)
            step = int(name[5:14])
            assert state["step"] == step
            assert torch.equal(state["w"], torch.full((4_000_000,), float(step)))
        store = CheckpointStore(str(directory), keep_last=3)  # cleans the torn temporaries
        assert not [n for n in os.listdir(directory) if n.startswith(".tmp-")]
        assert store.latest() == str(directory / sorted(complete)[-1])
    assert torn_writes > 0, "no kill landed inside a save; the test did not exercise anything"


def test_fsspec_urls_work_too() -> None:
    url = "memory://amptrain-test/job-1"
    store = CheckpointStore(url)
    where = store.save(1, {"step": 1}, CheckpointMeta(1, healthy=True, attempt=1))
    assert where.startswith("memory://") and where.endswith("amptrain-test/job-1/step-000000001.pt")
    for step in (2, 3):
        state = {"step": step, "w": torch.full((2,), float(step))}
        store.save(step, state, CheckpointMeta(step, healthy=step == 2, attempt=2))
    store.remove(1)
    assert store.steps() == [2, 3]
    assert [store.meta(s).healthy for s in (2, 3)] == [True, False]
    latest = store.latest()
    assert latest is not None and torch.equal(store.load(latest)["w"], torch.full((2,), 3.0))


def test_checkpoint_events_name_the_file_not_the_servers_path(tmp_path: Path) -> None:
    """Events reach the job's owner: they showed the worker's absolute checkpoint path."""
    first = ListSink()
    Trainer(spec("fp32", max_steps=8), RunContext(str(tmp_path), sink=first)).train()
    saved = [e["data"] for e in first.events("checkpoint")]
    assert saved == [{"name": "step-000000004.pt"}, {"name": "step-000000008.pt"}]
    again = ListSink()
    Trainer(spec("fp32", max_steps=10), RunContext(str(tmp_path), sink=again)).train()
    (resumed,) = again.events("resumed")
    assert resumed["data"] == {"from_step": 8, "name": "step-000000008.pt"}
    assert str(tmp_path) not in repr(first.items + again.items)
