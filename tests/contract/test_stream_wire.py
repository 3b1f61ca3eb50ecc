"""The packed metric entry (:mod:`amptrain.contract.stream_pack`) through a real Redis: every
kind of value in every field decodes exactly as the flat form an older worker writes, what
the packed layout cannot carry is written flat, and a packed field that is not one (wrong
length, unknown version, garbage) is undecodable (a ValueError, which every reader logs and
drops), never anything else."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract import stream_pack
from amptrain.contract.metrics import METRIC_FIELDS
from amptrain.contract.records import metric
from amptrain.contract.stream import decode, encode

KINDS: list[Any] = [
    0.25, -0.0, 1e-310, 1.7976931348623157e308, math.nan, -math.nan, math.inf, -math.inf,
    7, 0, -1, 2**53 + 1, 2**63 - 1, -(2**63), True, False, None, 7.0,
]  # fmt: skip
"""Every kind of value a metric field can hold: floats (subnormal, NaN of either sign,
+-Infinity), ints (to the int64 bounds, beyond a double's precision), booleans, null."""


@pytest.fixture
def client(session_redis: EmbeddedRedis) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(session_redis.url)
    c.delete("wire")
    yield c
    c.close()


def through_redis(client: redis.Redis, fields: Any) -> dict[str, Any]:
    eid = client.xadd("wire", fields)
    ((got_id, got),) = client.xrange("wire", min=eid, max=eid)  # type: ignore[misc]
    assert got_id == eid
    return decode(got)


def both(client: redis.Redis, item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    packed = encode(item, job_id="j", attempt=2)
    flat = encode(item, job_id="j", attempt=2, packed=False)
    return through_redis(client, packed), through_redis(client, flat)


def test_every_kind_in_every_field_decodes_as_the_flat_form(client: redis.Redis) -> None:
    base = metric(step=3, time=1.5, loss=0.5, memory_peak=12, skipped=False, skipped_steps=1)
    for name in METRIC_FIELDS:
        for value in KINDS:
            item = {**base, name: value}
            assert stream_pack.FIELD in encode(item, job_id="j", attempt=2)
            packed, flat = both(client, item)
            # repr: key order, NaN, 1 vs 1.0, -0.0 vs 0.0 and True vs 1 all count
            assert repr(packed) == repr(flat), (name, value)
            assert [type(v) for v in packed.values()] == [type(v) for v in flat.values()]


def test_what_the_layout_cannot_carry_is_written_flat(client: redis.Redis) -> None:
    parallel = metric(step=3, loss=0.5, world_size=2, memory_peak_per_rank=[5, 6])
    for item in (
        parallel,
        metric(step=3, memory_peak=2**63),  # beyond int64
        metric(step=-(2**63) - 1),
        {**metric(step=3), "loss": "0.5"},  # not a number
        {**metric(step=3), "loss": [1.0]},
    ):
        fields = encode(item, job_id="j", attempt=2)
        assert stream_pack.FIELD not in fields
        packed, flat = both(client, item)
        assert repr(packed) == repr(flat)
    assert both(client, parallel)[0]["memory_peak_per_rank"] == [5, 6]


def test_old_flat_entries_still_decode(client: redis.Redis) -> None:
    item = metric(step=9, time=2.0, loss=math.inf, loss_scale=65536, skipped=True, lr=0.1)
    flat = encode(item, job_id="j", attempt=1, packed=False)
    assert flat["loss"] == "Infinity" and flat["loss_scale"] == "65536"
    got = through_redis(client, flat)
    assert got == {"kind": "metric", "job_id": "j", "attempt": 1, **item} | {"loss": math.inf}


def _hostile() -> list[Any]:
    good = stream_pack.pack(metric(step=1, loss=0.5))
    assert good is not None
    bad_code = bytearray(good)
    bad_code[1] = 9
    return [
        good[:-1],  # one byte short
        good + b"\x00",  # one byte long
        bytes([stream_pack.VERSION + 1]) + good[1:],  # a version this reader does not know
        bytes(bad_code),  # a type code that names nothing
        b"\xff" * stream_pack.SIZE,  # garbage of the right length
        b"",
        b"not a packed field at all",
    ]


@pytest.mark.parametrize("blob", _hostile())
def test_a_hostile_packed_field_is_undecodable(client: redis.Redis, blob: bytes) -> None:
    fields = {"kind": "metric", "job_id": "j", "attempt": "1", stream_pack.FIELD: blob}
    client.xadd("wire", fields)  # type: ignore[arg-type]
    ((_, got),) = client.xrange("wire")  # type: ignore[misc]
    with pytest.raises(ValueError):
        decode(got)


def test_a_packed_field_as_text_is_undecodable() -> None:
    with pytest.raises(ValueError):
        decode({"kind": "metric", "job_id": "j", "attempt": "1", stream_pack.FIELD: "[1, 2]"})
