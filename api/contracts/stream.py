"""The Redis Stream contract between the worker (producer) and the API (recorder, live hub).

FastAPI- and torch-free: the worker imports it. One stream per job; entries
are flat string fields (about 2.5x smaller than one JSON blob per entry, see
FIELD-NOTES). Metric values are JSON scalars so ``null`` and booleans survive
the round trip.
"""

from __future__ import annotations

import json
import math
from typing import Any

from trainer_core.contract.records import METRIC_FIELDS

STREAM_MAXLEN = 100_000
"""Approximate bound (``MAXLEN ~``): the stream is a live buffer, SQL keeps history."""


def telemetry_key(job_id: str) -> str:
    return f"amptrain:job:{job_id}:telemetry"


def recorded_key(job_id: str) -> str:
    """The id of the newest stream entry the recorder has committed to SQL (and all before it)."""
    return f"amptrain:job:{job_id}:recorded"


def parse_id(entry_id: str | bytes) -> tuple[int, int]:
    """A stream entry id "ms-seq" as a sortable pair."""
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


def cancel_key(job_id: str) -> str:
    return f"amptrain:job:{job_id}:cancel"


def encode(
    item: dict[str, Any], *, job_id: str, attempt: int, persisted: bool = False
) -> dict[str, str]:
    """Flatten a record, an event or the end marker for XADD.

    The supervisor appends ``{"kind": "end", "status": ...}`` once the job is
    finished: the recorder then knows the stream is complete.

    ``persisted`` marks an event the supervisor already wrote to SQL itself
    (lifecycle events): the recorder skips it, live watchers still see it.
    """
    fields = {"kind": item["kind"], "job_id": job_id, "attempt": str(attempt)}
    if item["kind"] == "end":
        fields["status"] = str(item["status"])
    elif item["kind"] == "metric":
        fields.update({f: _json_scalar(item.get(f)) for f in METRIC_FIELDS})
    else:
        fields.update(
            type=str(item["type"]),
            step=json.dumps(item.get("step")),
            time=json.dumps(item.get("time")),
            data=json.dumps(item.get("data") or {}),
            persisted="1" if persisted else "0",
        )
    return fields


def decode(fields: dict[Any, Any]) -> dict[str, Any]:
    """Inverse of :func:`encode`; accepts bytes or str keys/values."""
    f = {_s(k): _s(v) for k, v in fields.items()}
    out: dict[str, Any] = {"kind": f["kind"], "job_id": f["job_id"], "attempt": int(f["attempt"])}
    if f["kind"] == "end":
        out["status"] = f.get("status")
    elif f["kind"] == "metric":
        out.update({name: json.loads(f[name]) for name in METRIC_FIELDS if name in f})
    else:
        out.update(
            type=f["type"],
            step=json.loads(f.get("step", "null")),
            time=json.loads(f.get("time", "null")),
            data=json.loads(f.get("data", "{}")),
            persisted=f.get("persisted") == "1",
        )
    return out


def _json_scalar(v: Any) -> str:
    """``json.dumps`` for the scalars a metric holds, at a fraction of its cost: this runs
    for every field of every step on the training child's publisher thread."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if type(v) is int or (type(v) is float and math.isfinite(v)):
        return repr(v)  # the same text json.dumps gives
    return json.dumps(v)  # NaN, Infinity and anything unusual


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
