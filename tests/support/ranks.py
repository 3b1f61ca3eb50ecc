"""The ``main`` of a rank script run under torchrun (``tests/engine/ddp_ranks.py``,
``tests/engine/fsdp_ranks.py``): two ranks, one gloo group, results saved for the test."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from amptrain.core.lifeline import leave_process_group
from amptrain.engine.distributed import Ranks


def run_scenarios(out: str, scenarios: Callable[[Ranks], dict[str, Any]]) -> None:
    """As one of the 2 ranks torchrun started: join one gloo group, run ``scenarios`` (the
    Trainers join this group and leave it open) and save what it returns to
    ``OUT/rank{r}.pt``."""
    ranks = Ranks.from_env(os.environ)
    assert ranks is not None and ranks.world_size == 2
    dist.init_process_group("gloo")
    try:
        results = scenarios(ranks)
    finally:
        dist.destroy_process_group()
    torch.save(results, os.path.join(out, f"rank{ranks.rank}.pt"))
    # As the worker's rank does: gloo's interpreter teardown can abort (SIGABRT) a rank
    # whose results are already written, failing the launch.
    leave_process_group(0)
