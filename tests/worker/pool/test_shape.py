"""A claimed job whose ``devices`` differs from its pool process's devices per job fails at
once, for good, naming both numbers; the slot shows its GPUs in GET /workers."""

from __future__ import annotations

import json

import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.redis import Keys
from amptrain.worker.pool.shape import DEVICES_MISMATCH, devices_mismatch
from amptrain.worker.pool.slot import JobSlot, PoolSlot


def test_a_job_of_another_shape_is_refused_naming_both_numbers() -> None:
    k1 = PoolSlot(index=0, gpus=("0",), devices_per_job=1)
    k2 = PoolSlot(index=1, gpus=("2", "3"), devices_per_job=2)
    assert devices_mismatch({"devices": 1}, k1, "w") is None
    assert devices_mismatch({}, k1, "w") is None  # a spec stored before `devices` existed
    assert devices_mismatch({"devices": 2}, k2, "w") is None

    refused = devices_mismatch({"devices": 2}, k1, "w@host")
    assert refused is not None
    assert refused.failure.code == DEVICES_MISMATCH and refused.failure.retryable is False
    assert "asks for 2 device(s)" in refused.failure.message
    assert "--devices-per-job 1" in refused.failure.message
    assert refused.event == {
        "job_devices": 2,
        "slot_devices": 1,
        "worker": "w@host",
        "slot": 0,
        "gpus": ["0"],
    }
    one = devices_mismatch({"devices": 1}, k2, "w")
    assert one is not None and one.event["slot_devices"] == 2 and one.event["gpus"] == ["2", "3"]


def test_a_slot_publishes_its_gpus(session_redis: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(session_redis.url)
    slot = PoolSlot(index=1, gpus=("2", "3"), devices_per_job=2)
    assert slot.gpu == "2" and PoolSlot().gpu is None
    job_slot = JobSlot(client, "w@shape-test", slot, ttl_s=30)
    job_slot.start("job-1", 1)
    try:
        shown = json.loads(client.get(Keys.worker_slot("w@shape-test", 1)) or "{}")
        assert shown["gpus"] == ["2", "3"] and shown["gpu"] == "2"
        assert shown["devices_per_job"] == 2
    finally:
        job_slot.clear()
        client.close()
