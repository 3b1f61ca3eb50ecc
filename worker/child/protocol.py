"""What the supervisor and the training child say to each other (torch-free).

The supervisor (a Celery pool process) imports this module; it must never
import the child's other modules, which pull in torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Launch:
    """What one attempt needs; travels as JSON on the child's stdin."""

    job_id: str
    attempt: int
    spec: dict[str, Any]
    checkpoint_dir: str
    redis_url: str
    data_roots: list[str] = field(default_factory=list)
    control_fd: int = -1

    def to_json(self) -> str:
        return json.dumps(asdict(self))
