"""A data file truncated under a running job: its training process dies of SIGBUS (a
memory-mapped page that is no longer there, which Python cannot catch), and the job fails
naming the file and the cause, not ``internal``, and is not retried onto other data."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from amptrain.core.enums import JobStatus
from amptrain.worker.pool.claim import Claim
from amptrain.worker.pool.verdict import final_state
from amptrain.worker.pool.watch import Outcome

# Builds the dataset (its inputs memory-mapped from the .npz), says so, waits until the
# parent has truncated the file, then reads the inputs again.
_READER = textwrap.dedent(
    """
    import sys
    from amptrain.components import registry
    from amptrain.contract.spec import ComponentRef

    ref = ComponentRef(name="tensors", args={"path": sys.argv[1]})
    ds = registry.build_dataset(ref, seed=0, data_roots=[sys.argv[2]])
    print(float(ds.inputs.sum()), flush=True)
    sys.stdin.readline()
    print(float(ds.inputs.sum()), flush=True)
    """
)


def _claim(args: dict[str, str]) -> Claim:
    spec = {"dataset": {"name": "tensors", "args": args}, "max_steps": 10}
    return Claim(job_id="j1", attempt=1, spec=spec, max_attempts=3, owner="w1")


def test_a_data_file_truncated_under_the_job_fails_it_naming_the_file(tmp_path: Path) -> None:
    x = np.ones((4096, 64), np.float32)  # 1 MiB of pages, mapped from the file
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(len(x)) % 3)
    child = subprocess.Popen(
        [sys.executable, "-c", _READER, "d.npz", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == str(float(x.sum()))  # mapped and read once
    with open(tmp_path / "d.npz", "r+b") as f:
        f.truncate(0)
    child.stdin.write("go\n")
    child.stdin.flush()
    _, err = child.communicate(timeout=60)
    assert child.returncode == -7, err  # SIGBUS

    status, error = final_state(_claim({"path": "d.npz"}), Outcome(exit_code=-7), 60)
    assert status == JobStatus.FAILED  # not re-queued, though attempts are left
    assert error == {
        "code": "invalid_spec",
        "message": "the training process was killed by SIGBUS: a memory-mapped data file "
        "(dataset.args.path 'd.npz') was truncated or changed while the job read it; keep a "
        "job's data files unchanged until it ends (write a new file, then rename it)",
        "step": None,
    }


def test_other_exits_without_a_result_are_internal_and_retried() -> None:
    claim = _claim({"path": "d.npz", "val_path": "v.npz"})
    status, error = final_state(claim, Outcome(exit_code=-9), 60)
    assert status == JobStatus.QUEUED and error is not None
    assert error["code"] == "internal"
    _, error = final_state(claim, Outcome(exit_code=-7), 60)
    assert (
        error is not None
        and "(dataset.args.path 'd.npz' or dataset.args.val_path 'v.npz')" in (error["message"])
    )
