"""A fork's claim: where its later attempts may resume, and the pin it releases at its end."""

from __future__ import annotations

from pathlib import Path

from amptrain.contract.layout import pin_name
from amptrain.core.checkpoint_pins import CheckpointPins
from amptrain.core.settings import Settings
from amptrain.worker.pool.claim import Claim, launch

FORK = "j_" + "e" * 32


def claim(attempt: int, fork_of: tuple[str, int] | None = ("j_parent", 40)) -> Claim:
    return Claim(FORK, attempt, {"max_steps": 80}, 3, "alice", fork_of=fork_of)


def test_a_forks_steps_through_its_fork_step_count_as_recorded() -> None:
    # Attempt 1 wrote its copy of step 40 and died before recording a step of its own:
    # attempt 3 may still resume from that copy (steps <= 40 are the parent's history).
    assert claim(3).with_fork_step({2: 55}) == {1: 40, 2: 55}
    assert claim(3, fork_of=None).with_fork_step({2: 55}) == {2: 55}


def test_the_launch_names_the_parents_directory_and_the_end_releases_the_pin(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path, checkpoint_url=str(tmp_path / "ckpt"))
    start = launch(settings, claim(1)).fork
    assert start is not None and start.step == 40
    assert start.checkpoint_dir == f"{tmp_path / 'ckpt'}/j_parent"
    assert launch(settings, claim(1, fork_of=None)).fork is None
    CheckpointPins(settings.checkpoint_url, "j_parent").pin(40, FORK)
    claim(1).release_pin(settings)
    assert not (tmp_path / "ckpt" / "j_parent" / pin_name(40, FORK)).exists()
