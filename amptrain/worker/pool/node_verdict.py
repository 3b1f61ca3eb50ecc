"""How a multi-node attempt ended, from each node's outcome (a pure decision, like
:mod:`amptrain.worker.pool.verdict` for one node and
:func:`amptrain.worker.pool.ranks.attempt_outcome` for one node's ranks).

Every node's :class:`~amptrain.worker.pool.ranks.RankGroup` reduces its ranks to one
outcome; the leader combines them here. The failed node is named in the error (worker and
address), since a peer's broken collective reads the same on every other node.
"""

from __future__ import annotations

from dataclasses import dataclass

from amptrain.worker.child.protocol import Failed, Finished
from amptrain.worker.pool.ranks import STOPPED
from amptrain.worker.pool.reservation import Member


@dataclass(frozen=True)
class NodeOutcome:
    """One node's outcome; ``result`` None: none came within the bound."""

    member: Member
    result: Finished | Failed | None
    holds_rank0: bool = False
    """The world's rank 0 ran here: its result is the attempt's."""
    lost_ranks: bool = False
    """A rank of this node ended without a result (killed, crashed)."""


def nodes_outcome(outcomes: list[NodeOutcome], waited_s: float) -> Finished | Failed:
    """The attempt's outcome. Every node finished: rank 0's result. Otherwise, in order:
    a node's real cause (not ``internal``, not a stop), a node that lost a rank, a node
    that said nothing within ``waited_s``, any other failure; a stop on request (cancel,
    preempt) only when it is all there is. Each failure names its node."""
    if outcomes and all(isinstance(o.result, Finished) for o in outcomes):
        first = next((o for o in outcomes if o.holds_rank0), outcomes[0])
        assert isinstance(first.result, Finished)
        return first.result
    failed = [o for o in outcomes if isinstance(o.result, Failed)]
    real = [o for o in failed if _code(o) not in STOPPED and _code(o) != "internal"]
    if real:
        return _named(real[0])
    lost = [o for o in failed if o.lost_ranks]
    if lost:
        return _named(lost[0])
    silent = [o for o in outcomes if o.result is None]
    if silent:
        return Failed(
            code="internal",
            message=(
                f"{silent[0].member.name} sent no outcome within {waited_s:g} s of the others "
                "ending (its worker died, hung or lost the network)"
            ),
            step=None,
            retryable=True,
        )
    broken = [o for o in failed if _code(o) not in STOPPED]
    if broken:
        return _named(broken[0])
    # Only stops: a cancel anywhere wins over a preempt, as the ranks' agreement does.
    stops = sorted(failed, key=lambda o: _code(o) != "cancelled")
    result = stops[0].result
    assert isinstance(result, Failed)
    return result


def _code(outcome: NodeOutcome) -> str:
    return outcome.result.code if isinstance(outcome.result, Failed) else ""


def _named(outcome: NodeOutcome) -> Failed:
    failed = outcome.result
    assert isinstance(failed, Failed)
    return failed.model_copy(update={"message": f"{outcome.member.name}: {failed.message}"})
