"""Placing a multi-node attempt: the leader reserves every node or none, in bounded time.

The pool process that claimed a ``nodes: N`` job (fenced, in SQL) is node 0. It picks a
free rendezvous port on its own address, creates the :class:`Reservation`, asks the job's
queue for N-1 followers (``amptrain.join_job`` messages: ids only) and waits up to
``AMPTRAIN_NODE_WAIT_SECONDS`` for them to join, renewing its lease meanwhile. Celery
hands a message only to an idle pool process (prefetch is off, acks are early), so a
join waits in the queue for a free slot and never behind a running job. If too few
join in time it deletes the reservation (a follower that joined sees it gone and leaves,
holding nothing) and says why: :func:`wait_reason`, from the live workers' slots.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core import presence
from amptrain.core.enums import JobStatus
from amptrain.core.nodes import node_address
from amptrain.core.settings import Settings
from amptrain.worker.main import drain
from amptrain.worker.pool.claim import Claim
from amptrain.worker.pool.reservation import Member, Reservation, Shape
from amptrain.worker.pool.slot import JobSlot
from amptrain.worker.pool.watch import Lease

log = logging.getLogger(__name__)

POLL_S = 0.1

SendJoin = Callable[[str, str, int], None]
"""Sends one ``amptrain.join_job`` message: (queue, job id, attempt)."""


@dataclass(frozen=True)
class Placed:
    """Every node joined: the reservation, its members (node 0 first) and the endpoint."""

    reservation: Reservation
    members: list[Member]
    endpoint: str
    rdzv_id: str


@dataclass(frozen=True)
class NotPlaced:
    """Why the attempt does not train: too few nodes (``reason``), a cancel, a lost lease."""

    why: Literal["unplaced", "cancelled", "lease_lost"]
    event: dict[str, Any] | None = None


def free_port(ports: tuple[int, int]) -> int | None:
    """A port of ``ports`` free on every interface now (the rendezvous store listens on
    all of them), from a random start (two slots of one worker placing at once rarely
    pick the same); None when every one is taken."""
    low, high = ports
    count = high - low + 1
    start = random.randrange(count)
    for i in range(count):
        port = low + (start + i) % count
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("", port))
            return port
    return None


def wait_reason(
    nodes: int, shape: Shape, queue: str, workers: list[dict[str, Any]], joined: int
) -> tuple[str, int]:
    """Why a ``nodes`` job could not be placed, and how many workers could take a node
    (this one, the ones that joined, and any other live worker of ``queue`` with a free
    slot, from presence)."""
    free = 0
    for info in workers:
        if info.get("draining") or queue not in (info.get("queues") or []):
            continue
        if int(info.get("concurrency") or 0) > len(info.get("current_jobs") or []):
            free += 1
    have = 1 + joined + free
    verb = "has" if have == 1 else "have"
    return (
        f"needs {nodes} workers with a free {shape.describe()} (queue {queue}); {have} {verb} one",
        have,
    )


class Placement:
    """The leader's wait for its followers (one attempt)."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        client: redis.Redis,
        slot: JobSlot,
        send_join: SendJoin,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.redis = client
        self.slot = slot
        self.send_join = send_join

    def reserve(self, claim: Claim) -> Placed | NotPlaced:
        shape = Shape(self.slot.pool_slot.devices_per_job, bool(self.slot.pool_slot.gpus))
        address = node_address(self.settings.node_address)
        port = free_port(self.settings.rdzv_ports)
        if port is None:  # every port of the range is in use here: like a full worker
            low, high = self.settings.rdzv_ports
            message = f"no free rendezvous port in {low}-{high} on {address}"
            return NotPlaced("unplaced", self._event(claim, message, 1))
        endpoint = f"{address}:{port}"
        leader = Member(0, self.slot.worker, address, self.slot.pool_slot.index)
        res = Reservation(self.redis, claim.job_id, claim.attempt)
        ttl = self.settings.lease_seconds
        res.create(claim.nodes, shape, leader, endpoint, ttl)
        self.slot.start(claim.job_id, claim.attempt, {"node": 0, "reservation": "waiting"})
        try:
            for _ in range(claim.nodes - 1):
                self.send_join(claim.queue, claim.job_id, claim.attempt)
        except Exception as exc:  # kombu raises many kinds; all mean "not sent"
            res.delete()
            why = f"could not ask queue {claim.queue} for nodes ({type(exc).__name__}: {exc})"
            return NotPlaced("unplaced", self._event(claim, why[:300], 1))
        log.info(
            "job %s: reserving %d nodes (rendezvous %s), waiting up to %g s",
            claim.job_id,
            claim.nodes,
            endpoint,
            self.settings.node_wait_seconds,
        )
        got = self._wait(claim, res)
        if got is not None:
            res.delete()
            return got
        members = res.members()
        if len(members) < claim.nodes:  # a follower may join in the last moment
            res.delete()
            return self._unplaced(claim, shape, len(members) - 1)
        return Placed(res, members, endpoint, f"{claim.job_id}-{claim.attempt}")

    def _wait(self, claim: Claim, res: Reservation) -> NotPlaced | None:
        """Until every follower joined (None) or the bound passed (None too: the caller
        counts); a cancel or a lost lease ends it early."""
        lease = Lease(self.sessions, claim.job_id, claim.attempt, self.settings.lease_seconds)
        deadline = time.monotonic() + self.settings.node_wait_seconds
        next_beat = time.monotonic() + self.settings.heartbeat_seconds
        while res.joined() < claim.nodes - 1 and time.monotonic() < deadline:
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.settings.heartbeat_seconds
                status = lease.renew()
                res.renew(self.settings.lease_seconds)
                self.slot.refresh()
                if status is None:
                    return NotPlaced("lease_lost")
                if status == JobStatus.CANCELLING:
                    return NotPlaced("cancelled")
            if drain.draining():  # this worker stops: give the job back now, not later
                return NotPlaced("unplaced", self._event(claim, "the first node drains", 1))
            time.sleep(POLL_S)
        return None

    def _unplaced(self, claim: Claim, shape: Shape, joined: int) -> NotPlaced:
        try:
            workers = presence.read_workers(self.redis)
        except redis.RedisError:
            workers = []
        message, have = wait_reason(claim.nodes, shape, claim.queue, workers, joined)
        return NotPlaced("unplaced", self._event(claim, message, have))

    def _event(self, claim: Claim, message: str, have: int) -> dict[str, Any]:
        wait = self.settings.node_wait_seconds
        log.warning("job %s not placed: %s; again in %g s", claim.job_id, message, wait)
        return {
            "message": f"{message}; the job is dispatched again in {wait:g} s",
            "nodes": claim.nodes,
            "available": have,
            "queue": claim.queue,
            "retry_after_s": wait,
        }
