"""The checkpoint manager: one index of a job's checkpoints (from their sidecars: whether
one is healthy is known without loading it), one lookup for resume, fallback and rollback,
pruning that keeps the newest healthy one whichever attempt wrote it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.engine.checkpoint import CheckpointMeta, CheckpointStore
from amptrain.engine.checkpoint_manager import CheckpointManager
from amptrain.engine.distributed import Group


def manager(directory: Path, keep_last: int = 2) -> CheckpointManager:
    store = CheckpointStore(str(directory))
    return CheckpointManager(store, keep_last, 1, Group(None, torch.device("cpu")))


def state(step: int, healthy: bool, attempt: int) -> dict[str, Any]:
    return {"step": step, "healthy": healthy, "attempt": attempt, "w": torch.full((2,), step)}


def test_pruning_keeps_the_newest_healthy_checkpoint_across_attempts(tmp_path: Path) -> None:
    first = manager(tmp_path)
    first.save(state(2, True, attempt=1))
    first.save(state(4, False, attempt=1))
    second = manager(tmp_path)  # the next attempt: knows 2 is healthy without loading it
    for step in (6, 8, 10):
        second.save(state(step, False, attempt=2))
    assert second.steps() == [2, 8, 10]
    assert CheckpointStore(str(tmp_path)).steps() == [2, 8, 10]
    second.save(state(12, True, attempt=2))
    assert second.steps() == [10, 12]  # a newer healthy one: 2 may go now


def test_health_and_lineage_come_from_the_sidecars_without_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = manager(tmp_path, keep_last=10)
    for step, healthy, attempt in ((2, True, 1), (4, False, 1), (6, True, 2), (8, False, 2)):
        writer.save(state(step, healthy, attempt))
    monkeypatch.setattr(CheckpointStore, "load", lambda *a: pytest.fail("loaded a checkpoint"))
    reader = manager(tmp_path, keep_last=10)
    assert reader.find() == 8
    assert reader.newest_healthy(8) == 6 and reader.newest_healthy(5) == 2
    assert reader.newest_healthy(1) is None
    assert reader.find(recorded={1: 9, 2: 5}) == 4  # attempt 2 recorded only up to step 5


def test_a_checkpoint_without_a_sidecar_is_read_once_to_learn_what_it_is(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(3, state(3, True, attempt=1), CheckpointMeta(3, healthy=True, attempt=1))
    os.remove(tmp_path / "step-000000003.json")  # as an engine before sidecars wrote it
    assert manager(tmp_path).newest_healthy(3) == 3


def test_a_sidecar_whose_checkpoint_never_landed_is_ignored_and_removed(tmp_path: Path) -> None:
    manager(tmp_path).save(state(2, True, attempt=1))
    (tmp_path / "step-000000004.json").write_text('{"step": 4, "healthy": true, "attempt": 1}')
    assert manager(tmp_path).steps() == [2]
    assert sorted(os.listdir(tmp_path)) == ["step-000000002.json", "step-000000002.pt"]


def test_discarding_after_a_step_removes_files_and_index_alike(tmp_path: Path) -> None:
    kept = manager(tmp_path, keep_last=10)
    for step in (2, 4, 6):
        kept.save(state(step, step == 2, attempt=1))
    kept.discard_after(2)
    assert kept.steps() == [2] and CheckpointStore(str(tmp_path)).steps() == [2]
    assert kept.load(2)["step"] == 2


@pytest.mark.parametrize("sidecar", ["not json", '{"healthy": "yes"}', "[1, 2]", '{"step": 3}'])
def test_a_damaged_sidecar_is_not_trusted(tmp_path: Path, sidecar: str) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(3, state(3, False, attempt=1), CheckpointMeta(3, healthy=False, attempt=1))
    (tmp_path / "step-000000003.json").write_text(sidecar)
    assert manager(tmp_path).newest_healthy(3) is None  # the checkpoint itself says unhealthy


def test_keep_last_never_removes_a_checkpoint_a_fork_pinned(tmp_path: Path) -> None:
    """The API pins a checkpoint for a fork while its job still trains (a file beside it,
    ``amptrain.core.checkpoint_pins``); pruning keeps it until the pin goes, then prunes it
    with the next save."""
    from amptrain.contract.layout import pin_name
    from amptrain.core.checkpoint_pins import CheckpointPins

    fork = "j_" + "f" * 32
    job = manager(tmp_path / "j_parent", keep_last=1)
    job.save(state(2, False, attempt=1))
    pins = CheckpointPins(str(tmp_path), "j_parent")
    pins.pin(2, fork)
    for step in (4, 6):
        job.save(state(step, False, attempt=1))
    assert job.steps() == [2, 6] and pins.steps() == [2, 6]
    assert (tmp_path / "j_parent" / pin_name(2, fork)).exists()
    pins.release(2, fork)
    pins.release(2, fork)  # twice (the fork's start and its end): harmless
    job.save(state(8, False, attempt=1))
    assert job.steps() == [8] and pins.steps() == [8]
    assert sorted(os.listdir(tmp_path / "j_parent")) == ["step-000000008.json", "step-000000008.pt"]
