"""The first node (the leader) of a multi-node attempt: its own ranks and the others' word.

:class:`NodeGroup` is the leader's :class:`~amptrain.worker.pool.ranks.RankGroup` (its
node's launcher and ranks) that also reads the attempt's inbox, where every other node
tells the precision its rank 0 chose (when the world's rank 0 runs there), its ranks, and
its outcome. :class:`~amptrain.worker.pool.watch.AttemptWatch` sees one training process
as ever: the precision message whichever node it comes from, and one final outcome, the
nodes' outcomes combined (:func:`~amptrain.worker.pool.node_verdict.nodes_outcome`) once
every node told its own or :attr:`outcome_wait_s` passed after this node's ranks ended.
It renews the reservation while it runs (a follower whose leader stops renewing it kills
its ranks) and ends it when closed or aborted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from amptrain.worker.child.protocol import (
    ControlMessage,
    Failed,
    Finished,
    Launch,
    PrecisionChosen,
    ProtocolError,
    decode,
)
from amptrain.worker.pool.node_verdict import NodeOutcome, nodes_outcome
from amptrain.worker.pool.ranks import STOPPED, NodeArgs, RankGroup
from amptrain.worker.pool.reservation import Member, Reservation

log = logging.getLogger(__name__)

RENEW_EVERY_S = 1.0  # the reservation's TTL is a lease; a few renewals fit in one
OUTCOME_GRACE_S = 15.0
"""Beyond the collective timeout, how long the leader waits for the others' outcomes
after its own ranks ended (their launchers tear down, Redis round trips)."""


def node_outcome(group: RankGroup, member: Member, result: Finished | Failed | None) -> NodeOutcome:
    """This node's outcome: its ranks' result, whether the world's rank 0 (the publisher)
    ran here, and whether a rank here ended without a result (killed, crashed)."""
    return NodeOutcome(
        member,
        result,
        holds_rank0=any(int(i["rank"]) == 0 for i in group.rank_infos()),
        lost_ranks=any(r is None for r in group.results().values()),
    )


def node_message(kind: str, member: Member, **data: Any) -> dict[str, Any]:
    """A follower's message to the leader (``ranks``, ``precision`` or ``outcome``)."""
    return {"type": kind, "node": member.node, **data}


class NodeGroup(RankGroup):
    """The leader's ranks plus what the other nodes say, behind ChildProcess's interface."""

    def __init__(
        self,
        launch: Launch,
        devices: int,
        gpus: str | None,
        passthrough: Sequence[str],
        nodes: NodeArgs,
        reservation: Reservation,
        members: list[Member],
        ttl_s: float,
    ) -> None:
        super().__init__(launch, devices, gpus, passthrough, nodes)
        self.reservation = reservation
        self.members = {m.node: m for m in members}
        self.ttl_s = ttl_s
        collective = launch.spec.get("collective_timeout_s", 600)
        self.outcome_wait_s = float(collective if isinstance(collective, int) else 600)
        self.outcome_wait_s += OUTCOME_GRACE_S
        self._inbox_at = 0
        self._outcomes: dict[int, NodeOutcome] = {}
        self._ranks: dict[int, list[dict[str, Any]]] = {}
        self._mine: NodeOutcome | None = None
        self._mine_at = 0.0
        self._concluded = False
        self._renewed_at = 0.0

    def messages(self, timeout: float) -> list[ControlMessage]:
        self._renew()
        out: list[ControlMessage] = []
        for msg in super().messages(timeout):
            if isinstance(msg, Finished | Failed):  # this node's part: combined below
                self._mine = node_outcome(self, self.members[0], msg)
                self._mine_at = time.monotonic()
            else:
                out.append(msg)
        out += self._read_inbox()
        if self._mine is not None and not self._concluded:
            waited = time.monotonic() - self._mine_at
            if len(self._outcomes) == len(self.members) - 1 or waited >= self.outcome_wait_s:
                self._concluded = True
                out.append(self._combined())
            elif not out:
                time.sleep(timeout)  # this node's launcher is gone: nothing else to wait on
        return out

    def finished(self) -> bool:
        return super().finished() and self._concluded

    def _combined(self) -> Finished | Failed:
        assert self._mine is not None
        everyone = [self._mine]
        for node, member in sorted(self.members.items()):
            if node:
                everyone.append(self._outcomes.get(node, NodeOutcome(member, None)))
        outcome = nodes_outcome(everyone, self.outcome_wait_s)
        log.info(
            "multi-node attempt ended: %s",
            "; ".join(f"{o.member.name}: {_ended(o.result)}" for o in everyone),
        )
        return outcome

    def _read_inbox(self) -> list[ControlMessage]:
        try:
            got = self.reservation.read_inbox(self._inbox_at)
        except Exception as exc:  # a Redis blip: read again next poll
            log.warning("multi-node inbox unreadable: %s", exc)
            return []
        self._inbox_at += len(got)
        out: list[ControlMessage] = []
        for item in got:
            member = self.members.get(int(item.get("node", -1)))
            if member is None or member.node == 0:
                continue
            try:
                self._take(item, member, out)
            except (ProtocolError, KeyError, TypeError, ValueError) as exc:
                log.error("bad message from %s: %s", member.name, exc)
        return out

    def _take(self, item: dict[str, Any], member: Member, out: list[ControlMessage]) -> None:
        kind = item["type"]
        if kind == "ranks":
            self._ranks[member.node] = list(item["ranks"])
        elif kind == "precision":
            out.append(PrecisionChosen.model_validate(item["message"]))
        elif kind == "outcome":
            result = decode(item["result"])
            if not isinstance(result, Finished | Failed):
                raise ProtocolError(f"not an outcome: {result!r}")
            self._outcomes[member.node] = NodeOutcome(
                member, result, bool(item["holds_rank0"]), bool(item["lost_ranks"])
            )
            if isinstance(result, Failed) and result.code not in STOPPED:
                # This node's ranks may wait in a collective on the failed one: end the
                # ones that linger after the grace every failed rank gets.
                self._failed_since = self._failed_since or time.monotonic()

    def _renew(self) -> None:
        now = time.monotonic()
        if now - self._renewed_at < RENEW_EVERY_S:
            return
        self._renewed_at = now
        try:
            self.reservation.renew(self.ttl_s)
        except Exception as exc:  # a Redis blip: the TTL spans several renewals
            log.warning("multi-node reservation not renewed: %s", exc)

    def describe(self) -> dict[str, Any]:
        """The processes of every node, as the ``started`` event shows them."""
        mine = super().describe()
        nodes = []
        for node, member in sorted(self.members.items()):
            ranks = mine["ranks"] if node == 0 else self._ranks.get(node, [])
            nodes.append({**member.as_dict(), "ranks": ranks})
        return {**mine, "nodes": nodes, "world_size": len(self.members) * self.devices}

    def abort(self) -> None:
        super().abort()
        self._end_reservation()

    def close(self) -> None:
        super().close()
        self._end_reservation()

    def _end_reservation(self) -> None:
        try:
            self.reservation.close()
        except Exception as exc:  # it expires with its TTL
            log.warning("multi-node reservation not ended: %s", exc)


def _ended(result: Finished | Failed | None) -> str:
    """How one node ended, for the log: ``finished at step 40``, ``cancelled at step 5``."""
    if result is None:
        return "no outcome"
    if isinstance(result, Finished):
        return f"finished at step {result.final_step}"
    return f"{result.code} at step {result.step}"
