"""An in-memory telemetry sink for engine tests: keeps every record the Trainer writes."""

from __future__ import annotations

from typing import Any


class ListSink:
    """Sink protocol implementation that appends each flushed record to ``items``."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def write(self, items: list[dict[str, Any]]) -> None:
        self.items += items

    def close(self) -> None:
        pass

    def metrics(self) -> dict[int, dict[str, Any]]:
        """Metric records by step (a later record for the same step wins)."""
        return {r["step"]: r for r in self.items if r["kind"] == "metric"}

    def events(self, type: str) -> list[dict[str, Any]]:
        """Event records of one type, in the order they were written."""
        return [r for r in self.items if r["kind"] == "event" and r["type"] == type]
