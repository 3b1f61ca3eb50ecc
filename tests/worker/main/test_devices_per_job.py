"""``amptrain worker --devices-per-job K``: which GPUs each pool process owns, which queues
the worker consumes and how many pool processes it starts."""

from __future__ import annotations

import click
import pytest

from amptrain.worker.main.cli import default_concurrency, shaped_queues
from amptrain.worker.main.devices import slot_gpus

EIGHT = tuple(str(i) for i in range(8))


def test_pool_process_i_owns_gpus_i_times_k_up_to_i_plus_one_times_k() -> None:
    assert [slot_gpus(i, EIGHT, 2) for i in range(4)] == [
        ("0", "1"),
        ("2", "3"),
        ("4", "5"),
        ("6", "7"),
    ]
    assert slot_gpus(1, EIGHT, 4) == ("4", "5", "6", "7")
    assert slot_gpus(0, EIGHT, 8) == EIGHT
    # Three per job on eight GPUs: two blocks; the last two GPUs are left unused.
    assert [slot_gpus(i, EIGHT, 3) for i in range(2)] == [("0", "1", "2"), ("3", "4", "5")]
    # One per job, as before: the i-th GPU, wrapping around past the last.
    assert [slot_gpus(i, ("0", "1"), 1) for i in range(3)] == [("0",), ("1",), ("0",)]
    assert slot_gpus(0, (), 2) == ()  # a CPU worker: its jobs' ranks run on the CPU


def test_the_worker_consumes_the_shape_queues_of_its_queues() -> None:
    assert shaped_queues(["gpu", "cpu"], 1) == ["gpu", "cpu"]  # one device: as always
    assert shaped_queues(["gpu", "cpu"], 2) == ["gpu-x2", "cpu-x2"]
    assert shaped_queues(["gpu-a100"], 8) == ["gpu-a100-x8"]
    with pytest.raises(click.BadParameter, match="16 characters"):
        shaped_queues(["a-fifteen-chars"], 2)


def test_one_pool_process_per_block_of_k_gpus() -> None:
    assert default_concurrency(EIGHT, 2) == 4
    assert default_concurrency(EIGHT, 1) == 8
    assert default_concurrency((), 2) == 1  # CPU: one pool process running K ranks
    with pytest.raises(click.BadParameter, match="sees 1 GPU"):
        default_concurrency(("0",), 2)  # two ranks on one GPU is not data parallelism
