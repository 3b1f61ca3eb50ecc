"""A checkpoint export into a weights root: the user's sub-directory, never through a
symlink, never over an existing file, never a half-written name."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from amptrain.server.weights_export import ExportExists, export_into


def test_an_export_lands_in_the_users_directory_and_never_replaces_a_file(tmp_path: Path) -> None:
    root = tmp_path / "weights"
    assert export_into(str(root), "alice", "a.safetensors", io.BytesIO(b"first")) == 5
    assert (root / "alice" / "a.safetensors").read_bytes() == b"first"
    with pytest.raises(ExportExists):
        export_into(str(root), "alice", "a.safetensors", io.BytesIO(b"second"))
    assert (root / "alice" / "a.safetensors").read_bytes() == b"first"
    assert os.listdir(root / "alice") == ["a.safetensors"]  # no temporary left behind


def test_a_users_directory_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "weights", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "mallory").symlink_to(elsewhere)
    with pytest.raises(OSError):
        export_into(str(root), "mallory", "x.safetensors", io.BytesIO(b"x"))
    assert os.listdir(elsewhere) == []
