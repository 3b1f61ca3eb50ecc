"""The messages a watcher receives: JSON ``{"type", "cursor", "data"}`` (see :mod:`amptrain.server.live.watch`).

``eval`` messages carry one evaluation: ``{"attempt", "step", "time", "values"}``, as
``GET /jobs/{id}/evals`` items show it (less the cursor, which the message carries);
``layer_grad_norm`` messages one step's per-layer gradient norms in the same shape, as
``GET /jobs/{id}/layer-norms`` items show them (``values``: layer -> norm).

A watcher that opted in to batch frames gets its ``metric``, ``eval``, ``layer_grad_norm``
and ``event`` messages
grouped: ``{"type": "batch", "cursor": CURSOR, "items": [MESSAGE, ...]}``, the items
being exactly the single messages, in order, and ``cursor`` the last item's cursor
(resume from it). ``end``, ``heartbeat`` and ``gap`` are still sent on their own.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from amptrain.contract.jsonsafe import finite
from amptrain.contract.metrics import EVAL_KIND, STORED_METRIC_FIELDS, VALUE_KINDS
from amptrain.core.enums import JobStatus
from amptrain.server.event_view import owner_view
from amptrain.server.live.hub import LiveEntry


@dataclass(frozen=True, slots=True)
class Out:
    """An outgoing message: its type, its cursor and its JSON text."""

    type: str
    cursor: str | None
    text: str


RECORD_TYPES = frozenset({"metric", *VALUE_KINDS, "event"})
"""The message types a batch frame groups."""
BATCH_MAX_ITEMS = 500
BATCH_MAX_CHARS = 256 * 1024
"""Bounds of one batch frame: far below a client's usual 1 MiB message limit."""


@dataclass(slots=True)
class Round:
    """The messages one delivery round sends a watcher, in order. ``shared``, when set,
    is where the watchers that take the very same stream entries share this round's
    batch frame: set only when every entry became a message (none skipped)."""

    outs: list[Out]
    shared: dict[str, str] | None = None

    @property
    def ended(self) -> bool:
        return bool(self.outs) and self.outs[-1].type == "end"


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
    data = {f: point.get(f) for f in STORED_METRIC_FIELDS}  # as history shows it
    data["attempt"] = point["attempt"]
    return Out("metric", cursor, message("metric", cursor, data))


def eval_out(cursor: str, evaluation: dict[str, Any], kind: str = EVAL_KIND) -> Out:
    """An eval (or layer_grad_norm) message from a recorded record or a stream record."""
    data = {k: evaluation[k] for k in ("attempt", "step", "time", "values")}
    return Out(kind, cursor, message(kind, cursor, data))


def record_out(kind: str, cursor: str, record: dict[str, Any]) -> Out:
    """The message for a ``metric``, ``eval``, ``layer_grad_norm`` or ``event`` record."""
    if kind == "metric":
        return metric_out(cursor, record)
    if kind in VALUE_KINDS:
        return eval_out(cursor, record, kind)
    return event_out(cursor, record)


def event_out(cursor: str, event: dict[str, Any]) -> Out:
    """An event message (``id`` is the SQL row id when known: the /events cursor), as its
    owner sees it: shared by every watcher, admins too (``GET /jobs/{id}/events`` has the
    rest)."""
    data = {
        "id": event.get("id"),
        "attempt": event["attempt"],
        "type": event["type"],
        "step": event["step"],
        "time": event["time"],
        "data": owner_view(event.get("data") or {}),
    }
    return Out("event", cursor, message("event", cursor, data))


def entry_out(entry: LiveEntry) -> Out:
    """The message for a stream entry, encoded once and shared by every watcher."""
    if entry.message is None:
        entry.message = record_out(entry.item["kind"], str(entry.pos), entry.item)
    message: Out = entry.message
    return message


def end_out(cursor: str | None, job: JobState) -> Out:
    data = {"status": job.status, "error": job.error, "step": job.step}
    return Out("end", cursor, message("end", cursor, data))


def gap_out(cursor: str | None) -> Out:
    data = {"reason": "slow consumer: resume from this cursor", "resume_after": cursor}
    return Out("gap", cursor, message("gap", cursor, data))


def heartbeat_out(cursor: str | None) -> Out:
    return Out("heartbeat", cursor, message("heartbeat", cursor, {"time": time.time()}))


def batch_out(items: list[Out]) -> Out:
    """One batch frame holding ``items`` (record messages, already encoded)."""
    cursor = items[-1].cursor
    body = ",".join([o.text for o in items])
    return Out(
        "batch", cursor, f'{{"type":"batch","cursor":{json.dumps(cursor)},"items":[{body}]}}'
    )


def batch_frames(round_: Round) -> list[Out]:
    """A round as batch-mode frames: runs of records grouped (bounded), others as they are.
    A round that fits one frame and may be shared is encoded once for all its watchers."""
    outs = round_.outs
    if round_.shared is not None and outs and len(outs) <= BATCH_MAX_ITEMS:
        key = str(outs[0].cursor)  # with nothing skipped, the first cursor fixes the entries
        text = round_.shared.get(key)
        if text is None and all(o.type in RECORD_TYPES for o in outs):
            text = round_.shared[key] = batch_out(outs).text
        if text is not None:
            return [Out("batch", outs[-1].cursor, text)]
    frames: list[Out] = []
    run: list[Out] = []
    chars = 0
    for out in outs:
        if out.type not in RECORD_TYPES:
            if run:
                frames.append(batch_out(run))
                run, chars = [], 0
            frames.append(out)
            continue
        if run and (len(run) >= BATCH_MAX_ITEMS or chars + len(out.text) > BATCH_MAX_CHARS):
            frames.append(batch_out(run))
            run, chars = [], 0
        run.append(out)
        chars += len(out.text)
    if run:
        frames.append(batch_out(run))
    return frames
