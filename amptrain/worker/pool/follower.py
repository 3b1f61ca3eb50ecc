"""A follower node of a multi-node attempt: the body of ``amptrain.join_job``.

A pool process that takes a join message joins the attempt's
:class:`~amptrain.worker.pool.reservation.Reservation` if its slot has the job's shape
and the reservation still waits for that attempt, then waits for ``go`` and runs its
node's launcher and ranks (:class:`~amptrain.worker.pool.ranks.RankGroup`, one c10d
rendezvous with the leader's). It needs no database: it writes no job state. It tells
the leader, through the attempt's inbox, its ranks, the precision the world's rank 0
chose when that rank runs here, and its node's outcome; the leader concludes. It kills
its ranks when the reservation disappears (the leader ended the attempt, gave up, or
died and stopped renewing it); a drain (SIGTERM to ``amptrain worker``) asks its ranks
to stop, which stops every node at the same step (the ranks agree on a stop code).
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import redis

from amptrain.core import redis as amptrain_redis
from amptrain.core.logs import log_context
from amptrain.core.nodes import node_address
from amptrain.core.settings import Settings
from amptrain.worker.child.protocol import Failed, Finished, Launch, PrecisionChosen, encode
from amptrain.worker.main import drain
from amptrain.worker.pool.nodes import node_message, node_outcome
from amptrain.worker.pool.ranks import NodeArgs, RankGroup, rendezvous_timeout, slot_gpus
from amptrain.worker.pool.reservation import GO, Member, Reservation
from amptrain.worker.pool.slot import JobSlot, PoolSlot

log = logging.getLogger(__name__)

POLL_S = 0.1
CHECK_EVERY_S = 1.0  # how often a training follower looks for its reservation
CHECK_TIMEOUT_S = 0.5
"""A look for the reservation gives up this soon: a node cut off from Redis must keep
watching its ranks (their failures, their teardown), not wait on a socket."""


class Follower:
    def __init__(
        self, settings: Settings, worker: str, pool_slot: PoolSlot, client: redis.Redis
    ) -> None:
        self.settings = settings
        self.worker = worker
        self.pool_slot = pool_slot
        self.redis = client
        self.probe = amptrain_redis.client(settings.redis_url, CHECK_TIMEOUT_S)
        # What the slot shows is best effort: never worth a long wait on a lost network.
        self.slot = JobSlot(self.probe, worker, pool_slot, settings.lease_seconds)

    def run(self, job_id: str, attempt: int) -> None:
        with log_context(job_id=job_id, worker=self.worker):
            res = Reservation(self.redis, job_id, attempt)
            member = self._join(res)
            if member is None:
                return
            self.slot.start(job_id, attempt, {"node": member.node, "reservation": "waiting"})
            try:
                fields = self._wait_for_go(res)
                if fields is not None:
                    self._train(res, member, fields)
            finally:
                self.slot.clear()
                self.probe.close()

    def _join(self, res: Reservation) -> Member | None:
        fields = res.fields()
        if fields is None:
            log.info(
                "join of %s #%d: no such reservation (ended); dropped", res.job_id, res.attempt
            )
            return None
        devices, gpu = int(fields["devices"]), fields["gpu"] == "1"
        if devices != self.pool_slot.devices_per_job or gpu != bool(self.pool_slot.gpus):
            # Routing by queue keeps shapes equal; a queue shared by two shapes does not.
            log.warning(
                "join of %s #%d refused: it needs %d %s device(s) per node, this slot has %d %s",
                res.job_id,
                res.attempt,
                devices,
                "gpu" if gpu else "cpu",
                self.pool_slot.devices_per_job,
                "gpu" if self.pool_slot.gpus else "cpu",
            )
            return None
        member = res.join(
            self.worker, node_address(self.settings.node_address), self.pool_slot.index
        )
        if member is None:
            log.info("join of %s #%d: reservation full or gone; dropped", res.job_id, res.attempt)
        else:
            log.info("joined %s #%d as %s", res.job_id, res.attempt, member.name)
        return member

    def _wait_for_go(self, res: Reservation) -> dict[str, str] | None:
        """The reservation once it says go; None when it went away. Bounded by the leader's
        wait (it deletes the reservation then) and by its TTL (the leader died)."""
        deadline = time.monotonic() + self.settings.node_wait_seconds + self.settings.lease_seconds
        next_refresh = time.monotonic() + self.settings.heartbeat_seconds
        while time.monotonic() < deadline:
            if time.monotonic() >= next_refresh:  # the slot's entry lapses with the lease
                next_refresh = time.monotonic() + self.settings.heartbeat_seconds
                self.slot.refresh()
            fields = res.fields()
            if fields is None:
                log.info("%s #%d: reservation ended before go", res.job_id, res.attempt)
                return None
            if fields.get("state") == GO:
                return fields
            time.sleep(POLL_S)
        return None

    def _train(self, res: Reservation, member: Member, fields: dict[str, str]) -> None:
        launch = Launch.model_validate_json(fields["launch"])
        # This node's own Redis address (the same server, perhaps by another route).
        launch = launch.model_copy(update={"redis_url": self.settings.redis_url})
        nodes = NodeArgs(
            nodes=int(fields["size"]),
            endpoint=fields["endpoint"],
            rdzv_id=fields["rdzv_id"],
            local_addr=member.address,
            join_timeout_s=rendezvous_timeout(launch.spec),
        )
        gpus, passthrough = slot_gpus(self.pool_slot), self.settings.child_env_passthrough
        group = RankGroup(launch, self.pool_slot.devices_per_job, gpus, passthrough, nodes)
        self.slot.note(reservation="training")
        try:
            result = self._watch(res, member, group)
            mine = node_outcome(group, member, result)
            message = node_message(
                "outcome",
                member,
                result=encode(result) if result else None,
                holds_rank0=mine.holds_rank0,
                lost_ranks=mine.lost_ranks,
            )
            if _tell(res, message):
                log.info("%s #%d: told the leader this node's outcome", res.job_id, res.attempt)
        finally:
            if group.alive():  # an exception above: nothing may outlive the attempt
                group.abort()
            group.close()

    def _watch(
        self, res: Reservation, member: Member, group: RankGroup
    ) -> Finished | Failed | None:
        result: Finished | Failed | None = None
        told_ranks = stopping = False
        next_check = time.monotonic() + CHECK_EVERY_S
        next_refresh = time.monotonic() + self.settings.heartbeat_seconds
        probe = Reservation(self.probe, res.job_id, res.attempt)
        while not group.finished():
            for msg in group.messages(POLL_S):
                if isinstance(msg, Finished | Failed):
                    result = msg
                elif isinstance(msg, PrecisionChosen):
                    told_ranks = self._tell_ranks(res, member, group, told_ranks)
                    _tell(res, node_message("precision", member, message=msg.model_dump()))
            told_ranks = self._tell_ranks(res, member, group, told_ranks)
            if time.monotonic() >= next_refresh:
                next_refresh = time.monotonic() + self.settings.heartbeat_seconds
                self.slot.refresh()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_EVERY_S
                if not self._leader_alive(probe):
                    log.warning(
                        "%s #%d: the reservation is gone (the leader ended the attempt or "
                        "died); killing this node's ranks",
                        res.job_id,
                        res.attempt,
                    )
                    group.abort()
                    continue
            if not stopping and drain.draining():
                stopping = True
                log.info(
                    "%s #%d: draining; asking this node's ranks to stop", res.job_id, res.attempt
                )
                group.signal(signal.SIGUSR2)
        return result

    def _tell_ranks(self, res: Reservation, member: Member, group: RankGroup, told: bool) -> bool:
        """Once every rank here started, tell the leader who they are (for ``started``)."""
        if told:
            return True
        infos = group.rank_infos()
        if len(infos) < group.devices:
            return False
        ranks = sorted(({"rank": int(i["rank"]), "pid": int(i["pid"])} for i in infos), key=str)
        _tell(res, node_message("ranks", member, ranks=ranks))
        return True

    def _leader_alive(self, res: Reservation) -> bool:
        try:
            return res.fields() is not None
        except redis.RedisError:
            return True  # a Redis blip is no lost leader; the collectives time out anyway


def _tell(res: Reservation, message: dict[str, Any]) -> bool:
    """Tell the leader; False when Redis cannot be reached (this node is cut off: the
    leader stops waiting for it within its bound, and the ranks' collectives time out)."""
    try:
        res.tell(message)
    except redis.RedisError as exc:
        log.warning("%s #%d: could not tell the leader: %s", res.job_id, res.attempt, exc)
        return False
    return True
