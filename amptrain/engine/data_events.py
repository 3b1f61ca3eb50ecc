"""The data path's events: how the data is fed (once, at the start) and the files skipped
as corrupt, handed to telemetry to go out with its next flush (no flush of their own: a
flush is a host sync, and a corrupt file per step must not cost one per step)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from amptrain.contract.records import (
    DATA_EVENT,
    DATA_SKIPPED_EVENT,
    MAX_CLASS_NAME_CHARS,
    MAX_CLASS_NAMES_SHOWN,
    MAX_NAME_CHARS,
    SKIPPED_PATHS_SHOWN,
    event,
)
from amptrain.engine.data import Feeder


def shown(text: object, limit: int = MAX_NAME_CHARS) -> str:
    """A name as an event shows it: printable characters only, cut to ``limit``."""
    plain = "".join(c if c.isprintable() else "?" for c in str(text)[: limit + 1])
    return plain if len(plain) <= limit else plain[: limit - 1] + "…"


def data_details(feeder: Feeder) -> dict[str, Any]:
    """The ``data`` event's details: the loader, and the dataset's class names if it has them."""
    workers = int(getattr(feeder, "workers", 0))
    loader = "device" if feeder.on_device else "processes" if workers else "threads"
    details: dict[str, Any] = {
        "loader": loader,
        "loader_workers": 0 if feeder.on_device else workers,
    }
    names = getattr(feeder.dataset, "class_names", None)
    if names is not None:
        names = list(names)
        details["class_count"] = len(names)
        details["class_names"] = [
            shown(n, MAX_CLASS_NAME_CHARS) for n in names[:MAX_CLASS_NAMES_SHOWN]
        ]
    return details


class DataEvents:
    """Builds the data events due at a telemetry flush (:meth:`take`)."""

    def __init__(self, feeder: Feeder) -> None:
        self._feeder = feeder
        self._start: dict[str, Any] | None = data_details(feeder)
        self.skipped = 0
        self._newest: deque[str] = deque(maxlen=SKIPPED_PATHS_SHOWN)

    def take(self, step: int) -> list[dict[str, Any]]:
        """The ``data`` event the first time; a ``data_skipped`` event when files were
        skipped since the last call."""
        now = time.time()
        events = []
        if self._start is not None:
            events.append(event(DATA_EVENT, step, now, **self._start))
            self._start = None
        paths = self._feeder.take_skipped()
        if paths:
            self.skipped += len(paths)
            self._newest.extend(shown(p) for p in paths)
            events.append(
                event(DATA_SKIPPED_EVENT, step, now, count=self.skipped, newest=list(self._newest))
            )
        return events
