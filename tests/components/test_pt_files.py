"""``.pt`` files of the ``tensors`` dataset hold tensors, and cost only what was counted.

A 1.5 KB pickle of lists that share themselves by reference (``[inner] * 8``, nine deep)
stands for 134 million numbers: it is refused once unpickled (a few KiB), before anything
turns it into a tensor. Legacy (non-zip) files are refused: read whole and copied, their
cost cannot be told before. A URL's archive is read whole and its tensors copied: twice
its size is counted.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

from amptrain.components import registry
from amptrain.contract import host_memory
from amptrain.contract.errors import InvalidSpecError, TooLargeError
from amptrain.contract.spec import ComponentRef

MiB = 2**20

# Loads the file in a fresh process whose address space may grow by at most 1 GiB, and
# prints the outcome and how much its peak resident memory grew meanwhile.
_LOADER = textwrap.dedent(
    """
    import re, resource, sys
    from amptrain.components import registry
    from amptrain.contract.spec import ComponentRef

    ref = ComponentRef(name="tensors", args={"path": sys.argv[1]})
    with open("/proc/self/status") as status:
        vm = int(re.search(r"VmSize:\\s+(\\d+) kB", status.read()).group(1)) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.RLIM_INFINITY))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        registry.build_dataset(ref, seed=0, data_roots=[sys.argv[2]])
        outcome = "loaded"
    except BaseException as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(grew * 1024)
    print(outcome)
    """
)


def _build(path: str, root: str, **args: Any) -> Any:
    ref = ComponentRef(name="tensors", args={"path": path, **args})
    return registry.build_dataset(ref, seed=0, data_roots=[root])


def test_a_memo_bomb_of_lists_is_refused_before_it_grows(tmp_path: Path) -> None:
    nested: list[Any] = [0.0]
    for _ in range(9):
        nested = [nested] * 8  # one memo entry per level: 8**9 numbers in 1.5 KB
    torch.save({"x": nested, "y": [0] * 8}, tmp_path / "bomb.pt")
    assert (tmp_path / "bomb.pt").stat().st_size < 2048
    run = subprocess.run(
        [sys.executable, "-c", _LOADER, "bomb.pt", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,  # the parent built the tensor for ~90 s here
    )
    assert run.returncode == 0, run.stderr
    grew, outcome = run.stdout.strip().splitlines()[-2:]
    assert outcome == (
        "InvalidSpecError: dataset.args.inputs_key: 'x' in the .pt file is a list, not a "
        "tensor; a .pt file must hold tensors (torch.save torch.tensor(values), not the values)"
    )
    assert int(grew) < 200 * MiB  # the parent peaked 514 MiB above its start


def test_lists_in_a_pair_and_legacy_files_are_refused(tmp_path: Path) -> None:
    torch.save((torch.zeros(4, 2), [0, 1, 0, 1]), tmp_path / "pair.pt")
    with pytest.raises(InvalidSpecError, match=r"^dataset.args.targets_key: 'y' .* is a list"):
        _build("pair.pt", str(tmp_path))
    tensors = {"x": torch.zeros(4, 2), "y": torch.tensor([0, 1, 0, 1])}
    torch.save(tensors, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(InvalidSpecError, match=r"'legacy.pt': not a readable PyTorch file"):
        _build("legacy.pt", str(tmp_path))
    torch.save(tensors, tmp_path / "d.pt")  # the same tensors, as torch.save writes them
    ds = _build("d.pt", str(tmp_path))
    assert ds.info.input_shape == (2,) and ds.info.num_classes == 2


def test_a_url_archive_counts_its_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    fs = fsspec.filesystem("memory")
    with fs.open("/team/big.pt", "wb") as f:
        torch.save({"x": torch.zeros(MiB, 2), "y": torch.zeros(MiB)}, f)  # 12 MiB
    machine: Callable[[], int] = lambda: 20 * MiB  # noqa: E731 - the file fits once, not twice
    monkeypatch.setattr(host_memory, "available", machine)
    with pytest.raises(
        TooLargeError,
        match=r"'memory://team/big.pt' \(a .* pickle, the file read whole and its tensors copied\)",
    ):
        _build("memory://team/big.pt", "memory://team")
    fs.rm("/team/big.pt")
