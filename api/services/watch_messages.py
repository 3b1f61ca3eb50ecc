"""The messages a watcher receives: JSON ``{"type", "cursor", "data"}`` (see :mod:`api.services.watch`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from api.contracts.jsonsafe import finite
from api.core.enums import JobStatus
from api.services.live_hub import LiveEntry
from trainer_core.contract.records import METRIC_FIELDS


@dataclass(frozen=True, slots=True)
class Out:
    """An outgoing message: its type, its cursor and its JSON text."""

    type: str
    cursor: str | None
    text: str


@dataclass(frozen=True, slots=True)
class JobState:
    """What a watcher needs to know of the job (from SQL)."""

    status: str
    attempt: int
    telemetry_done: bool
    error: dict[str, Any] | None
    step: int

    @property
    def complete(self) -> bool:
        """Finished, and every record of it is in SQL (a job never claimed has none)."""
        return JobStatus(self.status).finished and (self.telemetry_done or self.attempt == 0)


def message(type_: str, cursor: str | None, data: dict[str, Any]) -> str:
    return json.dumps(
        {"type": type_, "cursor": cursor, "data": finite(data)}, separators=(",", ":")
    )


def metric_out(cursor: str, point: dict[str, Any]) -> Out:
    """A metric message from a recorded point or a stream record."""
    data = {f: point.get(f) for f in METRIC_FIELDS}
    data["attempt"] = point["attempt"]
    return Out("metric", cursor, message("metric", cursor, data))


def event_out(cursor: str, event: dict[str, Any]) -> Out:
    """An event message (``id`` is the SQL row id when known: the /events cursor)."""
    data = {
        "id": event.get("id"),
        "attempt": event["attempt"],
        "type": event["type"],
        "step": event["step"],
        "time": event["time"],
        "data": event.get("data") or {},
    }
    return Out("event", cursor, message("event", cursor, data))


def entry_out(entry: LiveEntry) -> Out:
    """The message for a stream entry, encoded once and shared by every watcher."""
    if entry.text is None:
        cursor = str(entry.pos)
        item = entry.item
        made = metric_out(cursor, item) if item["kind"] == "metric" else event_out(cursor, item)
        entry.text = made.text
    return Out("metric" if entry.item["kind"] == "metric" else "event", str(entry.pos), entry.text)


def end_out(cursor: str | None, job: JobState) -> Out:
    data = {"status": job.status, "error": job.error, "step": job.step}
    return Out("end", cursor, message("end", cursor, data))


def gap_out(cursor: str | None) -> Out:
    data = {"reason": "slow consumer: resume from this cursor", "resume_after": cursor}
    return Out("gap", cursor, message("gap", cursor, data))


def heartbeat_out(cursor: str | None) -> Out:
    return Out("heartbeat", cursor, message("heartbeat", cursor, {"time": time.time()}))
