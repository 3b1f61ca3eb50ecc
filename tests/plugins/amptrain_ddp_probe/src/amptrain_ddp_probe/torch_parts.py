"""The probe model: an ordinary MLP plus two test seams that change no numerics.

- ``signal_rank``/``signal_at``: that rank sends itself SIGTERM during its ``signal_at``-th
  training forward pass, as a worker would to ask one rank to stop.
- ``hang_rank``/``hang_at``/``hang_until``: that rank stops making progress (sleeps,
  ignoring stop signals, as a rank stuck in a kernel or a deadlocked data loader would)
  during its ``hang_at``-th training forward pass until the file ``hang_until`` exists
  (``''``: forever), so a test can act on a run held at a known step.
- ``pace``: every training forward pass first sleeps this many seconds, so a run that only
  has to hold a slot and keep stepping until a test cancels it costs no core's worth of CPU
  (with its points, the recorder's and the database's) beside the rest of the suite.
- ``digest_dir``: at interpreter exit each rank writes the SHA-256 of its parameters to
  ``digest-rank{r}.txt``, so a test can compare the ranks' final weights.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from amptrain.components.base import DataInfo


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def digest(model: nn.Module) -> str:
    """SHA-256 over every parameter's bytes, in registration order."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Probe(nn.Module):
    def __init__(
        self,
        info: DataInfo,
        width: int,
        signal_rank: int,
        signal_at: int,
        hang_rank: int = -1,
        hang_at: int = 0,
        hang_until: str = "",
        pace: float = 0.0,
    ) -> None:
        super().__init__()
        features = 1
        for size in info.input_shape:
            features *= size
        self.fc1, self.fc2 = nn.Linear(features, width), nn.Linear(width, info.num_classes)
        self.signal_rank, self.signal_at = signal_rank, signal_at
        self.hang_rank, self.hang_at, self.hang_until = hang_rank, hang_at, hang_until
        self.pace = pace
        self.calls = 0
        self.rank = 0  # known once training runs (the process group exists by then)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            self.rank = _rank()
            if self.pace:
                time.sleep(self.pace)
            if self.calls == self.signal_at and self.rank == self.signal_rank:
                os.kill(os.getpid(), signal.SIGTERM)
            if self.calls == self.hang_at and self.rank == self.hang_rank:
                while not (self.hang_until and Path(self.hang_until).exists()):
                    time.sleep(0.1)  # hung: stop signals are not seen until it goes on
        return self.fc2(F.gelu(self.fc1(x.flatten(1))))


def build_probe(
    info: DataInfo,
    width: int = 32,
    signal_rank: int = -1,
    signal_at: int = 0,
    digest_dir: str = "",
    hang_rank: int = -1,
    hang_at: int = 0,
    hang_until: str = "",
    pace: float = 0.0,
) -> nn.Module:
    model = Probe(info, width, signal_rank, signal_at, hang_rank, hang_at, hang_until, pace)
    if digest_dir and not next(model.parameters()).is_meta:  # not the memory estimate's copy

        def write() -> None:
            Path(digest_dir, f"digest-rank{model.rank}.txt").write_text(digest(model))

        atexit.register(write)
    return model
