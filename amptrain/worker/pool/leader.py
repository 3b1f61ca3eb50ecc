"""Node 0 of a multi-node attempt (``nodes`` > 1): the supervisor's part that only a
leader plays. It reserves the other nodes (:class:`~amptrain.worker.pool.placement.Placement`),
gives the job back when they cannot all be had (nothing charged, dispatched again later,
a ``waiting_for_nodes`` event saying why), and starts its own node as a
:class:`~amptrain.worker.pool.nodes.NodeGroup` once it told every node to go. The
supervisor then watches and concludes the attempt as it does any other.
"""

from __future__ import annotations

import logging

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.records import WAITING_FOR_NODES
from amptrain.core.settings import Settings
from amptrain.store import jobs
from amptrain.worker.child.protocol import Launch
from amptrain.worker.pool.claim import Claim
from amptrain.worker.pool.events import LifecycleEvents
from amptrain.worker.pool.nodes import NodeGroup
from amptrain.worker.pool.placement import NotPlaced, Placed, Placement, SendJoin
from amptrain.worker.pool.ranks import NodeArgs, rendezvous_timeout, slot_gpus
from amptrain.worker.pool.slot import JobSlot
from amptrain.worker.pool.watch import Outcome

log = logging.getLogger(__name__)


class Leader:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        client: redis.Redis,
        slot: JobSlot,
        events: LifecycleEvents,
        send_join: SendJoin,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.redis = client
        self.slot = slot
        self.events = events
        self.placement = Placement(settings, sessions, client, slot, send_join)
        self.placed: Placed | None = None

    def place(self, claim: Claim) -> bool | Outcome:
        """True: every node reserved (:attr:`placed`); else what the supervisor concludes
        (a cancel while placing), or False: nothing to conclude (given back, fenced out)."""
        try:
            placed = self.placement.reserve(claim)
        except BaseException:
            self.slot.clear()
            raise
        if isinstance(placed, Placed):
            self.placed = placed
            return True
        self.slot.clear()
        if placed.why == "cancelled":
            return Outcome(stop_requested="cancel")
        if placed.why == "lease_lost":
            log.warning("job %s attempt %d lost its lease placing", claim.job_id, claim.attempt)
        else:
            self.give_back(claim, placed)
        return False

    def give_back(self, claim: Claim, why: NotPlaced) -> None:
        """No training was tried: the budget is not charged, and the job waits a while
        before it is dispatched again, so it never spins through the workers."""
        wait = self.settings.node_wait_seconds
        with self.sessions.begin() as s:
            done = jobs.release(s, claim.job_id, claim.attempt, unplaced_wait_s=wait)
        if done:
            job, attempt, data = claim.job_id, claim.attempt, why.event or {}
            self.events.conclude(job, attempt, WAITING_FOR_NODES, 0, data, end_status=None)

    def start(self, claim: Claim, launch: Launch) -> NodeGroup | None:
        """Tell every node to go and start this one's launcher, which hosts the rendezvous;
        None when the reservation expired meanwhile (the followers left): given back."""
        placed = self.placed
        assert placed is not None, "start() follows a place() that returned True"
        self.slot.note(node=0, nodes=len(placed.members), reservation="training")
        if not placed.reservation.go(launch.model_dump_json()):
            self.give_back(claim, NotPlaced("unplaced", {"message": "the reservation expired"}))
            return None
        args = NodeArgs(
            nodes=len(placed.members),
            endpoint=placed.endpoint,
            rdzv_id=placed.rdzv_id,
            local_addr=placed.members[0].address,
            join_timeout_s=rendezvous_timeout(launch.spec),
            is_host=True,
        )
        pool_slot = self.slot.pool_slot
        return NodeGroup(
            launch,
            pool_slot.devices_per_job,
            slot_gpus(pool_slot),
            self.settings.child_env_passthrough,
            args,
            placed.reservation,
            placed.members,
            self.settings.lease_seconds,
        )
