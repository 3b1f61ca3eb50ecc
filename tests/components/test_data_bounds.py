"""Dataset files and datasets are bounded before they are read or allocated: only regular
files are opened (a FIFO does not block, a device is not read), what a file declares must
fit the memory the training process has (``.npy`` headers before anything is inflated),
uncompressed arrays are memory-mapped, and built-in datasets are sized before they are built.

Where a test needs a machine with little memory it says how little by replacing
``host_memory.available`` (the kernel's MemAvailable, see tests/contract/test_host_memory.py).
"""

from __future__ import annotations

import io
import os
import stat
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from amptrain.components import registry
from amptrain.contract import host_memory
from amptrain.contract.errors import InvalidSpecError, TooLargeError, TrainingError
from amptrain.contract.spec import ComponentRef

MiB = 2**20


def _build(path: str, root: Path, **args: Any) -> Any:
    ref = ComponentRef(name="tensors", args={"path": path, **args})
    return registry.build_dataset(ref, seed=0, data_roots=[str(root)])


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``machine(n)``: from now on the training process has ``n`` bytes available."""

    def set_available(n: int) -> None:
        monkeypatch.setattr(host_memory, "available", lambda root=host_memory.ROOT: n)

    return set_available


def npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return out.getvalue()  # the magic string, then the header


def bomb(path: Path, shape: tuple[int, ...], *, data_bytes: int) -> None:
    """A deflated .npz whose member ``x`` declares ``shape`` (float32) and holds
    ``data_bytes`` zero bytes after its header; ``y`` is one small honest array."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as member:
            member.write(npy_header(shape))
            chunk = bytes(4 * MiB)
            left = data_bytes
            while left > 0:
                member.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
        labels = io.BytesIO()
        np.save(labels, np.zeros(max(1, shape[0] if shape[0] < 10**6 else 1), np.int64))
        z.writestr("y.npy", labels.getvalue())


# -- special files ------------------------------------------------------------------------


def test_a_fifo_is_refused_at_once_instead_of_blocking_the_job(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "d.npz")
    outcome: list[BaseException | None] = []

    def build() -> None:
        try:
            _build("d.npz", tmp_path)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=build, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # blocked in open(): give it a writer so the thread can end
        fd = os.open(tmp_path / "d.npz", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(10)
        pytest.fail("opening a FIFO in a data root blocked the job")
    (error,) = outcome
    assert isinstance(error, InvalidSpecError), error
    assert error.message == (
        "dataset.args.path: 'd.npz' is a FIFO, not a regular file; only regular files are read"
    )


def test_a_device_or_a_directory_is_never_read(tmp_path: Path) -> None:
    try:  # /dev/null's numbers: harmless even if it were read
        os.mknod(tmp_path / "dev.npz", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    (tmp_path / "dir.npz").mkdir()
    (tmp_path / "link.npz").symlink_to(tmp_path / "dev.npz")  # never followed
    for name, kind in [("dev.npz", "a character device"), ("dir.npz", "a directory")]:
        with pytest.raises(InvalidSpecError) as err:
            _build(name, tmp_path)
        assert err.value.message == (
            f"dataset.args.path: {name!r} is {kind}, not a regular file; only regular files "
            "are read"
        )
    with pytest.raises(InvalidSpecError) as err:
        _build("link.npz", tmp_path)
    assert err.value.message == (
        "dataset.args.path: 'link.npz' could not be opened beneath the data roots: a symlink "
        "or a changing path"
    )


# -- sizes declared before anything is inflated ---------------------------------------------


def test_a_header_declaring_a_terabyte_is_refused_without_allocating_it(tmp_path: Path) -> None:
    # 1 TiB declared by the member's .npy header, 4 KiB stored: before, numpy allocated the
    # declared array and then read into it; now the header is checked against the member.
    bomb(tmp_path / "d.npz", (2**38,), data_bytes=4096)
    assert (tmp_path / "d.npz").stat().st_size < 64 * 1024
    with pytest.raises(InvalidSpecError) as err:
        _build("d.npz", tmp_path)
    assert err.value.message == (
        "dataset.args.path: 'd.npz': 'x.npy' holds fewer bytes than its header declares"
    )


def test_a_compression_bomb_within_the_file_limit_is_refused_by_its_header(
    tmp_path: Path, machine: Callable[[int], None]
) -> None:
    # 64 MiB of zeros deflate to ~64 KiB (1000:1); the process has 32 MiB.
    bomb(tmp_path / "d.npz", (16 * MiB,), data_bytes=64 * MiB)
    assert (tmp_path / "d.npz").stat().st_size < MiB
    machine(32 * MiB)
    with pytest.raises(TooLargeError, match=r"needs about 64\.0 MiB .* has 32\.0 MiB available"):
        _build("d.npz", tmp_path)


def test_uncompressed_arrays_are_mapped_not_read(
    tmp_path: Path, machine: Callable[[int], None]
) -> None:
    x = np.arange(32 * MiB // 4, dtype=np.float32).reshape(-1, 64)  # 32 MiB of inputs
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(len(x)) % 3)  # stored, as np.savez writes
    machine(16 * MiB)  # half the inputs: only the mapping makes it fit
    ds = _build("d.npz", tmp_path)
    assert ds.info.input_shape == (64,)
    assert torch.equal(ds.inputs[12345], torch.from_numpy(x[12345]))
    # The same inputs as float64 need a float32 copy of 32 MiB: refused before the copy.
    np.savez(tmp_path / "e.npz", x=x.astype(np.float64), y=np.arange(len(x)) % 3)
    with pytest.raises(TooLargeError, match="its float32 inputs and int64 labels"):
        _build("e.npz", tmp_path)


def test_compressed_pt_archives_and_oversized_csv_are_refused(
    tmp_path: Path, machine: Callable[[int], None]
) -> None:
    torch.save({"x": torch.zeros(8, 2), "y": torch.zeros(8)}, tmp_path / "plain.pt")
    with (
        zipfile.ZipFile(tmp_path / "plain.pt") as src,
        zipfile.ZipFile(tmp_path / "packed.pt", "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert _build("plain.pt", tmp_path).info.input_shape == (2,)
    with pytest.raises(InvalidSpecError, match=r"a \.pt archive with compressed members"):
        _build("packed.pt", tmp_path)
    (tmp_path / "d.csv").write_text("0.5,1\n" * (2 * MiB // 6))  # 2 MiB of text
    machine(8 * MiB)  # parsing takes up to 5x the text
    with pytest.raises(TooLargeError, match=r"'d.csv' \(a 2.0 MiB file\) needs about 10.0 MiB"):
        _build("d.csv", tmp_path)


# -- built-in datasets sized before they are built -------------------------------------------


def test_a_synthetic_dataset_larger_than_the_machine_fails_before_allocating() -> None:
    # ~112 GiB by its footprint; building it would allocate 38 GiB for its inputs first.
    ref = ComponentRef(
        name="synthetic-classification", args={"features": 1024, "num_samples": 10_000_000}
    )
    with pytest.raises(TrainingError) as err:
        registry.build_dataset(ref, seed=0)
    assert isinstance(err.value, TooLargeError), err.value
    assert err.value.message.startswith(
        "too large for this worker: the dataset 'synthetic-classification' needs about "
    )
    assert "available here" in err.value.message
