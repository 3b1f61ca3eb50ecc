"""A rank gets NCCL's failure settings from its launcher before its process group is
built (a hung collective then aborts and names itself); an operator's own values win."""

from __future__ import annotations

from amptrain.engine.distributed import NCCL_DEFAULTS
from amptrain.worker.child.rank import add_nccl_defaults


def test_a_rank_gets_nccl_failure_settings_and_the_operators_values_win() -> None:
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "PATH": "/bin"}
    add_nccl_defaults(env, NCCL_DEFAULTS)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"  # set by the operator: kept
    assert env["PATH"] == "/bin"
