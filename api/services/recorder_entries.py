"""A batch of stream entries as the rows the recorder writes (see :mod:`api.store.recording`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from api.contracts.cursor import Cursor
from api.contracts.jsonsafe import finite
from api.contracts.stream import decode
from api.core.redis import text
from trainer_core.contract.records import METRIC_FIELDS

log = logging.getLogger(__name__)

Entry = tuple[Any, dict[Any, Any] | None]


@dataclass
class Batch:
    """Points and events to insert, and the attempts whose ``end`` entry came."""

    points: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)


def parse(job_id: str, entries: Iterable[Entry]) -> Batch:
    batch = Batch()
    for eid, fields in entries:
        if not fields:
            continue  # trimmed from the stream while pending
        entry_id = text(eid)
        try:
            item = decode(fields)
        except (KeyError, ValueError):
            log.error("job %s: undecodable stream entry %s dropped", job_id, entry_id)
            continue
        if item["kind"] == "metric":
            if isinstance(item.get("step"), int):
                batch.points.append(_point_row(job_id, entry_id, item))
        elif item["kind"] == "event":
            batch.events.append(_event_row(job_id, entry_id, item))
        elif item["kind"] == "end":
            batch.ends.append(item["attempt"])
    return batch


def _point_row(job_id: str, entry_id: str, item: dict[str, Any]) -> dict[str, Any]:
    ms, seq = Cursor.of_entry(entry_id)
    row = {f: item.get(f) for f in METRIC_FIELDS}
    row.update(job_id=job_id, attempt=item["attempt"], stream_ms=ms, stream_seq=seq)
    return row


def _event_row(job_id: str, entry_id: str, item: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": item["id"],  # set when the API wrote the event to SQL first
        "job_id": job_id,
        "attempt": item["attempt"],
        "type": item["type"],
        "step": item["step"],
        "time": item["time"] if item["time"] is not None else time.time(),
        "data": finite(item["data"]),
        "source_id": entry_id,
    }
