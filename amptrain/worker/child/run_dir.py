"""The private directory one data-parallel attempt runs in (torch-free; both sides use it).

torchrun forwards no stdin and closes inherited descriptors, so the ranks of a
``devices`` > 1 attempt talk to the supervisor through files in a directory only the
worker's user can read:

- ``launch.json``: the attempt's :class:`~amptrain.worker.child.protocol.Launch` (written once);
- ``rank-{r}.json``: the pid, global rank and rendezvous port of this node's rank r, written before it trains, so the
  supervisor can signal it and, on a lost lease, kill it by pid;
- ``control``: rank 0's control messages (one JSON line each, appended);
- ``result-{r}.json``: how this node's rank r ended, a :class:`~amptrain.worker.child.protocol.Finished` or
  :class:`~amptrain.worker.child.protocol.Failed` (written atomically when it ends).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAUNCH = "launch.json"
CONTROL = "control"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def launch(self) -> Path:
        return self.path / LAUNCH

    @property
    def control(self) -> Path:
        return self.path / CONTROL

    def rank_info(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.json"

    def result(self, rank: int) -> Path:
        return self.path / f"result-{rank}.json"

    def write_atomic(self, path: Path, text: str) -> None:
        """Readers see the whole file or none of it."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

    def read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
