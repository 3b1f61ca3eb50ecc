"""The nodes of one multi-node attempt (``nodes`` > 1), reserved all at once in Redis.

The pool process that claimed the job (node 0, the leader) creates the reservation
(:data:`Keys.reservation`, a hash with a TTL it renews) holding only what the other nodes
need: the attempt, the size, the shape of a slot that may join (devices per job, cpu or
gpu), the c10d rendezvous (endpoint and id) and, once every node joined, the launch. Each
``amptrain.join_job`` message a follower takes adds it atomically (:data:`_JOIN`, one Lua
script: only while the reservation exists for that attempt, waits, and is not full), then
the follower waits for ``go`` or for the reservation to disappear (the leader gave up,
finished, or died and stopped renewing it). Followers tell the leader what it must know
through the attempt's inbox (:data:`Keys.node_inbox`). Nothing here comes from a user's
string: keys are built from the validated job id and the attempt number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from amptrain.contract.stream import text
from amptrain.core.redis import Keys

WAITING, GO = "waiting", "go"
INBOX_TTL_S = 3600  # an inbox outlives a lost leader by at most this

# KEYS[1] the reservation; ARGV: attempt, member JSON. Returns the member's node index
# (1..size-1), or 0: gone or another attempt's, -1: no longer waiting or full.
_JOIN = """
local attempt = redis.call('HGET', KEYS[1], 'attempt')
if not attempt or attempt ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'waiting' then return -1 end
local joined = tonumber(redis.call('HGET', KEYS[1], 'joined'))
if joined >= tonumber(redis.call('HGET', KEYS[1], 'size')) - 1 then return -1 end
joined = joined + 1
redis.call('HSET', KEYS[1], 'joined', joined, 'member:' .. joined, ARGV[2])
return joined
"""

# KEYS[1]; ARGV: attempt, field, value. Sets a field only on this attempt's reservation.
_SET_IF_ATTEMPT = """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
"""

# KEYS[1]; ARGV: attempt. Deletes the reservation only if it is still this attempt's.
_DELETE_IF_ATTEMPT = """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""

# KEYS[1]; ARGV: attempt, ttl ms. Renews only this attempt's reservation.
_RENEW = """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""


@dataclass(frozen=True)
class Member:
    """One node of the attempt: which worker (and pool slot) and where the others reach it."""

    node: int
    worker: str
    address: str
    slot: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "worker": self.worker,
            "address": self.address,
            "slot": self.slot,
        }

    def json(self) -> str:
        """As stored under ``member:{node}`` (the index is the field's)."""
        return json.dumps({"worker": self.worker, "address": self.address, "slot": self.slot})

    @property
    def name(self) -> str:
        """How a message names this node: index, worker and address."""
        return f"node {self.node} ({self.worker}, {self.address})"


@dataclass(frozen=True)
class Shape:
    """What a slot must be to join: devices per job, and whether it trains on GPUs."""

    devices: int
    gpu: bool

    def describe(self) -> str:
        kind = "gpu" if self.gpu else "cpu"
        return f"{kind} slot" if self.devices == 1 else f"{self.devices}-device {kind} slot"


class Reservation:
    """One job's reservation in Redis, as one attempt (leader or follower) sees it."""

    def __init__(self, client: redis.Redis, job_id: str, attempt: int) -> None:
        self.redis = client
        self.job_id = job_id
        self.attempt = attempt
        self.key = Keys.reservation(job_id)
        self.inbox = Keys.node_inbox(job_id, attempt)

    # -- the leader ----------------------------------------------------------------------

    def create(self, size: int, shape: Shape, leader: Member, endpoint: str, ttl_s: float) -> None:
        """A fresh reservation for this attempt (an older attempt's is replaced: its
        followers see another attempt and leave)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.key, self.inbox)
        pipe.hset(
            self.key,
            mapping={
                "attempt": str(self.attempt),
                "size": str(size),
                "joined": "0",
                "state": WAITING,
                "devices": str(shape.devices),
                "gpu": "1" if shape.gpu else "0",
                "endpoint": endpoint,
                "rdzv_id": f"{self.job_id}-{self.attempt}",
                "member:0": leader.json(),
            },
        )
        pipe.pexpire(self.key, int(ttl_s * 1000))
        pipe.execute()

    def joined(self) -> int:
        """Followers joined so far (0 when the reservation is gone)."""
        raw = self.redis.hget(self.key, "joined")
        return int(raw) if raw is not None else 0

    def go(self, launch_json: str) -> bool:
        """Every node joined: hand them the launch. False if the reservation is gone."""
        set_launch = self.redis.eval(
            _SET_IF_ATTEMPT, 1, self.key, str(self.attempt), "launch", launch_json
        )
        return bool(set_launch) and bool(
            self.redis.eval(_SET_IF_ATTEMPT, 1, self.key, str(self.attempt), "state", GO)
        )

    def renew(self, ttl_s: float) -> bool:
        """Keep the reservation alive; False once it is gone (or another attempt's)."""
        return bool(self.redis.eval(_RENEW, 1, self.key, str(self.attempt), int(ttl_s * 1000)))

    def delete(self) -> None:
        """End it: followers still waiting leave, followers training kill their ranks."""
        self.redis.eval(_DELETE_IF_ATTEMPT, 1, self.key, str(self.attempt))

    def members(self) -> list[Member]:
        """Every node that joined, node 0 first."""
        raw = self.redis.hgetall(self.key)
        found = []
        for field, value in raw.items():
            name = text(field)
            if name.startswith("member:"):
                found.append(Member(node=int(name.removeprefix("member:")), **json.loads(value)))
        return sorted(found, key=lambda m: m.node)

    def read_inbox(self, start: int) -> list[dict[str, Any]]:
        """The followers' messages from index ``start`` on."""
        return [json.loads(m) for m in self.redis.lrange(self.inbox, start, -1)]

    def close(self) -> None:
        """The attempt ended: the reservation and its inbox go."""
        self.delete()
        self.redis.delete(self.inbox)

    # -- a follower ------------------------------------------------------------------------

    def fields(self) -> dict[str, str] | None:
        """The reservation if it exists for this attempt, else None."""
        raw = {text(k): text(v) for k, v in self.redis.hgetall(self.key).items()}
        if raw.get("attempt") != str(self.attempt):
            return None
        return raw

    def join(self, worker: str, address: str, slot: int) -> Member | None:
        """Take a node of this attempt; None when it is gone, another attempt's or full."""
        unplaced = Member(node=0, worker=worker, address=address, slot=slot)
        node = int(self.redis.eval(_JOIN, 1, self.key, str(self.attempt), unplaced.json()))
        if node <= 0:
            return None
        return Member(node=node, worker=worker, address=address, slot=slot)

    def tell(self, message: dict[str, Any]) -> None:
        """Send the leader a message (JSON-safe) through the attempt's inbox."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.rpush(self.inbox, json.dumps(message))
        pipe.expire(self.inbox, INBOX_TTL_S)
        pipe.execute()
