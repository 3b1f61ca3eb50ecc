"""Which workers are alive, what they run on, and what they are training right now.

Workers publish, the API reads (FastAPI- and torch-free: the worker imports it).
Everything here expires on its own, so a worker that dies without a word
disappears from ``GET /workers`` within one TTL. The keys (names in
:class:`amptrain.core.redis.Keys`):

- ``Keys.worker_info(name)``: JSON of the worker (queues, concurrency,
  ``devices_per_job``, ``slots`` (each pool process's index and ``gpus``),
  devices, versions, ``last_heartbeat``); rewritten with a TTL by a heartbeat
  thread in the worker's main process.
- ``Keys.worker_slot(name, i)``: JSON of the job pool process ``i`` is
  supervising (job id, attempt, GPU and ``gpus``, latest step, throughput, loss
  scale, memory); written by that supervisor, TTL = the job's lease.
- ``Keys.WORKERS``: sorted set name -> last heartbeat, so readers find the
  names without SCAN; entries older than a day are pruned by readers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from amptrain.contract.admission import WorkerMemory
from amptrain.contract.stream import text
from amptrain.core.redis import Keys

FORGET_AFTER_S = 86_400.0


def presence_ttl(heartbeat_s: float) -> float:
    """How long a worker stays listed after its last heartbeat: three missed beats."""
    return 3 * heartbeat_s + 2


def publish_worker(client: redis.Redis, worker: str, info: dict[str, Any], ttl_s: float) -> None:
    """(Re)announce ``worker``; ``info`` gets ``last_heartbeat`` = now."""
    now = time.time()
    payload = json.dumps({**info, "name": worker, "last_heartbeat": now}, default=str)
    pipe = client.pipeline(transaction=False)
    pipe.set(Keys.worker_info(worker), payload, px=int(ttl_s * 1000))
    pipe.zadd(Keys.WORKERS, {worker: now})
    pipe.execute()


def remove_worker(client: redis.Redis, worker: str) -> None:
    """A clean shutdown: disappear at once instead of after the TTL."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(Keys.worker_info(worker))
    pipe.zrem(Keys.WORKERS, worker)
    pipe.execute()


def publish_slot(
    client: redis.Redis, worker: str, slot: int, data: dict[str, Any], ttl_s: float
) -> None:
    client.set(Keys.worker_slot(worker, slot), json.dumps(data, default=str), px=int(ttl_s * 1000))


def clear_slot(client: redis.Redis, worker: str, slot: int) -> None:
    client.delete(Keys.worker_slot(worker, slot))


def read_slots(client: redis.Redis, worker: str, concurrency: int) -> list[dict[str, Any]]:
    """The jobs ``worker``'s pool processes are running now (each with its ``slot``)."""
    if concurrency <= 0:
        return []
    raw = client.mget([Keys.worker_slot(worker, i) for i in range(concurrency)])
    return [{"slot": i, **json.loads(v)} for i, v in enumerate(raw) if v is not None]


def served_queues(client: redis.Redis) -> set[str]:
    """The queues some live worker consumes now (a draining worker takes nothing new)."""
    names = [
        text(n) for n in client.zrangebyscore(Keys.WORKERS, time.time() - FORGET_AFTER_S, "+inf")
    ]
    if not names:
        return set()
    served: set[str] = set()
    for raw in client.mget([Keys.worker_info(n) for n in names]):
        if raw is None:
            continue
        info = json.loads(raw)
        if not info.get("draining"):
            served.update(info.get("queues") or [])
    return served


def queue_memory(client: redis.Redis, queue: str) -> list[WorkerMemory]:
    """What a training process could get on each live worker that takes ``queue`` (workers
    that report it; a draining worker takes nothing new)."""
    names = [
        text(n) for n in client.zrangebyscore(Keys.WORKERS, time.time() - FORGET_AFTER_S, "+inf")
    ]
    found = []
    for raw in client.mget([Keys.worker_info(n) for n in names]) if names else []:
        info = json.loads(raw) if raw is not None else {}
        available = info.get("memory_available_bytes")
        if info.get("draining") or queue not in (info.get("queues") or []) or available is None:
            continue
        gpu = any(d.get("type") == "cuda" for d in info.get("devices") or [])
        found.append(WorkerMemory(int(available), gpu))
    return found


def read_workers(client: redis.Redis) -> list[dict[str, Any]]:
    """Every live worker, newest heartbeat first, each with its ``current_jobs``."""
    client.zremrangebyscore(Keys.WORKERS, "-inf", time.time() - FORGET_AFTER_S)
    names = [text(n) for n in client.zrevrange(Keys.WORKERS, 0, -1)]
    if not names:
        return []
    infos = client.mget([Keys.worker_info(n) for n in names])
    workers = []
    for name, raw in zip(names, infos, strict=True):
        if raw is None:
            continue  # expired: the worker stopped heartbeating
        info = json.loads(raw)
        info["current_jobs"] = read_slots(client, name, int(info.get("concurrency") or 0))
        workers.append(info)
    return workers
