"""The Redis Stream contract between the worker (producer) and the API (recorder, live hub).

FastAPI- and torch-free: the worker imports it. One stream per job
(:meth:`amptrain.core.redis.Keys.telemetry`); entries are flat string fields (about
2.5x smaller than one JSON blob per entry, as measured). Metric values are
JSON scalars so ``null`` and booleans survive the round trip.

A one-device ``metric`` entry is written *packed*: its values in one binary field
(:mod:`amptrain.contract.stream_pack`, versioned), which the recorder reads a batch at a
time with numpy. A record the packed layout cannot carry exactly (a data-parallel run's
fields, an int beyond 64 bits, an unexpected type) is written flat as before.

Compatibility window: every reader (:func:`decode`, and through it the live hub and the
worker's slot; the recorder's :mod:`amptrain.server.recorder.entries`) reads both the flat
and the packed form, so a stream an older worker wrote records and streams the same.
Deploy the readers first: the API (recorder and live hub) and then the workers (their
pool reads the stream too); a worker writes packed entries as soon as it runs this code,
and an older API would drop them as undecodable. A later packed version follows the
same order.

Five kinds of entry: ``metric`` (one optimizer step), ``eval`` (one evaluation on the
held-out split: ``step``, ``time`` and ``values``, a JSON object of named values),
``layer_grad_norm`` (one step's per-layer gradient norms, the same fields), ``event`` and
``end`` (the attempt's supervisor has finished the job: the stream is
complete).

How an event gets its ONE cursor (:mod:`amptrain.contract.cursor`)
--------------------------------------------------------------
Every event a watcher can see takes one route, so history (SQL) and the live
tail (the stream) carry it at the same position:

* Events of a running attempt -- the engine's (checkpoint, warning, ...) and the
  supervisor's lifecycle events (started, requeued, succeeded, failed,
  cancelled) -- are appended to the job's stream (by the training child's sink
  and by ``amptrain.worker.pool.events``, both buffered and re-sent after Redis lost
  data). The recorder inserts them into SQL with their entry id as cursor.
* Events the API writes about a job that has run (the reconciler reaping an
  expired lease, a cancel or a rejection after a re-queue) are written to SQL in
  the same transaction as the status change, so they can never be lost, with no
  cursor yet. The recorder that owns the job's stream appends each to the stream
  (carrying its SQL ``id``) once it has drained the stream, and records the
  entry id as its cursor when it reads the entry back, in stream order. Until
  then it is in no watcher's sequence.
* Events of a job no worker ever claimed (``queued``, cancelled while queued,
  rejected before dispatch; attempt 0) belong to no stream: their cursor is
  ``0-{id}``, which sorts before every stream entry (stream ids start at ms > 0).

Job *status* is not carried here: it stays the fenced SQL truth written by the
supervisor and the reconciler. The stream carries only the narrative.
"""

from __future__ import annotations

import json
import math
from typing import Any

from amptrain.contract import stream_pack
from amptrain.contract.metrics import METRIC_FIELDS, PARALLEL_METRIC_FIELDS, VALUE_KINDS


def text(value: Any) -> str:
    """A stream value as ``str`` (Redis clients return bytes; tests sometimes pass str)."""
    return value.decode() if isinstance(value, bytes) else str(value)


STREAM_MAXLEN = 100_000
"""Approximate bound (``MAXLEN ~``): the stream is a live buffer, SQL keeps history."""


Fields = dict[str, str | bytes]
"""An entry as XADD takes it: text, and the packed metric field's bytes."""


def encode(item: dict[str, Any], *, job_id: str, attempt: int, packed: bool = True) -> Fields:
    """Flatten a metric record, an event or the end marker for XADD.

    A one-device metric record is packed (see the module docstring) unless ``packed`` is
    False (an older worker's flat form: tests of the compatibility window use it). An
    event relayed from SQL carries its row's ``id`` (see the module docstring).
    """
    fields: Fields = {"kind": item["kind"], "job_id": job_id, "attempt": str(attempt)}
    if item["kind"] == "end":
        fields["status"] = str(item["status"])
    elif item["kind"] == "metric" and packed and _one_device(item):
        blob = stream_pack.pack(item)
        if blob is not None:
            fields[stream_pack.FIELD] = blob
            return fields
        return encode(item, job_id=job_id, attempt=attempt, packed=False)
    elif item["kind"] == "metric":
        fields.update({f: _json_scalar(item.get(f)) for f in METRIC_FIELDS})
        # A data-parallel run's extra fields (a list among them); absent for one device,
        # which keeps its entries as small as before.
        fields.update({f: json.dumps(item[f]) for f in PARALLEL_METRIC_FIELDS if f in item})
    elif item["kind"] in VALUE_KINDS:
        fields.update(
            step=str(int(item["step"])),
            time=_json_scalar(item.get("time")),
            values=json.dumps(item["values"]),
        )
    else:
        fields.update(
            type=str(item["type"]),
            step=json.dumps(item.get("step")),
            time=json.dumps(item.get("time")),
            data=json.dumps(item.get("data") or {}),
        )
        if item.get("id") is not None:
            fields["event_id"] = str(int(item["id"]))
    return fields


def decode(fields: dict[Any, Any]) -> dict[str, Any]:
    """Inverse of :func:`encode`, of either form of a metric entry; accepts bytes or str
    keys/values (the packed field's value: bytes). ValueError or KeyError: undecodable."""
    packed = fields.get(_PACKED_BYTES, fields.get(stream_pack.FIELD))
    f = {text(k): text(v) for k, v in fields.items() if k not in _PACKED_NAMES}
    out: dict[str, Any] = {"kind": f["kind"], "job_id": f["job_id"], "attempt": int(f["attempt"])}
    if f["kind"] == "end":
        out["status"] = f.get("status")
    elif f["kind"] == "metric" and packed is not None:
        out.update(zip(METRIC_FIELDS, stream_pack.unpack(packed), strict=True))
    elif f["kind"] == "metric":
        out.update({name: json.loads(f[name]) for name in METRIC_FIELDS if name in f})
        out.update({name: json.loads(f[name]) for name in PARALLEL_METRIC_FIELDS if name in f})
    elif f["kind"] in VALUE_KINDS:
        out.update(
            step=int(f["step"]),
            time=json.loads(f.get("time", "null")),
            values=json.loads(f["values"]),
        )
    else:
        out.update(
            type=f["type"],
            step=json.loads(f.get("step", "null")),
            time=json.loads(f.get("time", "null")),
            data=json.loads(f.get("data", "{}")),
            id=int(f["event_id"]) if "event_id" in f else None,
        )
    return out


_PACKED_BYTES = stream_pack.FIELD.encode()
_PACKED_NAMES = (_PACKED_BYTES, stream_pack.FIELD)


def _one_device(item: dict[str, Any]) -> bool:
    return not any(name in item for name in PARALLEL_METRIC_FIELDS)


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
