"""Local dataset files are opened beneath their data root without following any symlink:
a directory of the path swapped for a symlink while the job opens it (the race of issue
37) never leads out of the roots, and never fails as ``internal``."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from amptrain.components import registry
from amptrain.components.beneath import open_beneath
from amptrain.contract.data_access import user_roots
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import ComponentRef

LEVELS = 300  # a long walk widens the window between checking a path and opening it
TRIES = 200
DEADLINE_S = 10.0
RENAME_EXCHANGE = 2
AT_FDCWD = -100

# The helper: swaps two names atomically until killed (or 30 s, should the kill be lost);
# it says "swapping" once the first exchange worked, so the test never starts before.
SWAPPER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b = (os.fsencode(p) for p in sys.argv[1:3])
end = time.monotonic() + 30
first = True
while time.monotonic() < end:
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    if first:
        print("swapping", flush=True)
        first = False
"""


def _renameat2_missing(tmp_path: Path) -> str | None:
    """Why ``renameat2(RENAME_EXCHANGE)`` cannot be used here, or None when it can."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        return "the C library has no renameat2 (glibc < 2.28)"
    a, b = tmp_path / "probe-a", tmp_path / "probe-b"
    a.write_text("a")
    b.write_text("b")
    if libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) != 0:
        return f"renameat2(RENAME_EXCHANGE): {os.strerror(ctypes.get_errno())}"
    assert a.read_text() == "b"
    return None


def _tree(top: Path, value: float) -> None:
    """``top/a/a/.../data.npz`` (``LEVELS`` deep) whose inputs are all ``value``."""
    deep = top.joinpath(*["a"] * LEVELS)
    deep.mkdir(parents=True)
    np.savez(deep / "data.npz", x=np.full((4, 2), value, np.float32), y=np.arange(4) % 2)


def _build(path: str, roots: list[str]) -> Any:
    ref = ComponentRef(name="tensors", args={"path": path})
    return registry.build_dataset(ref, seed=0, data_roots=roots)


def _inputs(path: str, roots: list[str]) -> float:
    return float(_build(path, roots).batch(0, 1)[0][0, 0])


def test_a_directory_swapped_for_a_symlink_never_leads_out_of_the_roots(tmp_path: Path) -> None:
    if (why := _renameat2_missing(tmp_path)) is not None:
        pytest.skip(why)
    root, outside = tmp_path / "root", tmp_path / "outside"
    _tree(root / "race" / "d", 1.0)
    _tree(outside, 666.0)
    (root / "race" / "link").symlink_to(outside, target_is_directory=True)
    path = "race/d/" + "a/" * LEVELS + "data.npz"
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(root / "race" / "d"), str(root / "race" / "link")],
        stdout=subprocess.PIPE,
        text=True,
    )
    counts = {"inside": 0, "outside": 0, "refused": 0}
    others: list[BaseException] = []
    try:
        assert swapper.stdout is not None
        assert swapper.stdout.readline() == "swapping\n", swapper.wait()
        end = time.monotonic() + DEADLINE_S
        for _ in range(TRIES):
            if time.monotonic() > end:
                break
            try:
                value = _inputs(path, [str(root)])
            except InvalidSpecError as exc:
                counts["refused"] += 1
                assert exc.message.startswith("dataset.args.path: "), exc.message
                assert str(tmp_path) not in exc.message
            except Exception as exc:  # an OSError that escaped: the job failed 'internal'
                others.append(exc)
            else:
                counts["inside" if value == 1.0 else "outside"] += 1
    finally:
        swapper.kill()
        swapper.wait()
    print(f"race outcomes: {counts}, other errors: {len(others)}")
    assert counts["outside"] == 0, (counts, others[:3])
    assert others == [], (counts, others[:3])
    assert sum(counts.values()) > 0


def test_a_symlink_inside_the_path_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _tree(root / "real", 1.0)
    (root / "alias").symlink_to(root / "real", target_is_directory=True)  # even inside
    path = "alias/" + "a/" * LEVELS + "data.npz"
    assert _inputs("real/" + "a/" * LEVELS + "data.npz", [str(root)]) == 1.0
    with pytest.raises(InvalidSpecError) as err:
        _build(path, [str(root)])
    assert err.value.message.endswith(
        "could not be opened beneath the data roots: a symlink or a changing path"
    )
    assert err.value.message.startswith("dataset.args.path: 'alias/a/a/")
    assert str(tmp_path) not in err.value.message


def test_a_root_reached_through_symlinks_still_works(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    (real / "team").mkdir(parents=True)
    np.savez(real / "team" / "d.npz", x=np.full((4, 2), 3.0, np.float32), y=np.arange(4) % 2)
    (tmp_path / "root").symlink_to(real, target_is_directory=True)  # the operator's
    roots = [str(tmp_path / "root")]
    assert _inputs("team/d.npz", roots) == 3.0
    assert _inputs(str(tmp_path / "root" / "team" / "d.npz"), roots) == 3.0
    assert _inputs(str(real / "team" / "d.npz"), roots) == 3.0
    (tmp_path / "data" / "alice").mkdir(parents=True)  # per user: R/<owner>, a symlink too
    (tmp_path / "data" / "bob").symlink_to(real, target_is_directory=True)
    bob = user_roots([str(tmp_path / "data")], "bob", per_user=True)
    assert _inputs("team/d.npz", bob) == 3.0
    alice = user_roots([str(tmp_path / "data")], "alice", per_user=True)
    with pytest.raises(InvalidSpecError, match="no such file under the data roots"):
        _build("team/d.npz", alice)
    with pytest.raises(InvalidSpecError, match="must stay inside the data roots"):
        _build("../bob/team/d.npz", alice)
    with pytest.raises(InvalidSpecError, match="outside the allowed data roots"):
        _build(str(tmp_path / "data" / "bob" / "team" / "d.npz"), alice)


def test_dot_dot_and_empty_components_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _tree(root / "team", 1.0)
    _tree(tmp_path / "outside", 666.0)
    with pytest.raises(InvalidSpecError, match="must stay inside the data roots"):
        _build("team/../../outside/" + "a/" * LEVELS + "data.npz", [str(root)])
    for relative in ("team/../x.npz", "team/./x.npz", "team//x.npz", "/team/x.npz"):
        with pytest.raises(OSError) as err:
            open_beneath(str(root), relative)
        assert err.value.errno == errno.EINVAL
