"""How a data-parallel attempt's outcome is read from its ranks' results, and how the
worker starts torchrun (no process is started here: the launches are in
tests/system/test_ddp_jobs.py)."""

from __future__ import annotations

from pathlib import Path

from amptrain.worker.child.protocol import Failed, Finished
from amptrain.worker.pool.ranks import attempt_outcome, launcher_args, slot_gpus
from amptrain.worker.pool.slot import PoolSlot

DONE = Finished(final_step=40, resumed_from=None, skipped_steps=0, dropped_records=0)
BROKEN = Failed(code="internal", message="Connection closed by peer", step=None, retryable=True)
OOM = Failed(code="out_of_memory", message="CUDA out of memory", step=12, retryable=False)


def test_every_rank_finished_is_rank_0s_result() -> None:
    assert attempt_outcome({0: DONE, 1: DONE}, 0) == DONE


def test_a_specific_error_wins_over_its_peers_broken_collective() -> None:
    assert attempt_outcome({0: BROKEN, 1: OOM}, 1) == OOM
    assert attempt_outcome({0: OOM, 1: None}, 1) == OOM


def test_a_rank_without_result_fails_the_attempt_retryably_naming_a_peers_error() -> None:
    out = attempt_outcome({0: BROKEN, 1: None}, 1)
    assert isinstance(out, Failed) and out.retryable and out.code == "internal"
    assert out.message == (
        "data-parallel process(es) 1 of 2 ended without a result (the launcher exited with "
        "code 1); process 0: Connection closed by peer"
    )
    # A finished rank does not make the attempt a success while another left nothing.
    assert isinstance(attempt_outcome({0: DONE, 1: None}, -9), Failed)


def test_torchrun_never_restarts_and_the_slot_gpus_are_all_visible_to_the_ranks() -> None:
    args = launcher_args(4, Path("/run/x"))
    assert args[args.index("--max-restarts") + 1] == "0"
    assert args[args.index("--nproc-per-node") + 1] == "4" and "--standalone" in args
    assert args[-3:] == ["-m", "amptrain.worker.child.rank", "/run/x"]
    assert slot_gpus(PoolSlot(0, ("2", "3"), 2)) == "2,3"
    assert slot_gpus(PoolSlot(0, (), 2)) is None


def test_a_node_of_a_multi_node_attempt_joins_a_c10d_rendezvous_and_never_restarts() -> None:
    from amptrain.worker.pool.ranks import NodeArgs

    nodes = NodeArgs(2, "10.0.0.1:29400", "j_ab-3", "10.0.0.2", 45)
    args = launcher_args(1, Path("/run/x"), nodes)
    assert "--standalone" not in args
    pairs = dict(zip(args[:-3:2], args[1:-3:2], strict=True))
    assert pairs == {
        "--nnodes": "2",
        "--rdzv-backend": "c10d",
        "--rdzv-endpoint": "10.0.0.1:29400",
        "--rdzv-id": "j_ab-3",
        "--rdzv-conf": "join_timeout=45,is_host=false",
        "--local-addr": "10.0.0.2",
        "--nproc-per-node": "1",
        "--max-restarts": "0",
        "--monitor-interval": "0.2",
    }
