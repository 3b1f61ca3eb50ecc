"""The ``tensors`` dataset against a hostile spec: no network probes through dataset URLs,
and errors that name the problem without quoting the file or the worker's paths."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from amptrain.components import registry
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import ComponentRef
from tests.support.stack import wait_until

SECRET = "TOP-SECRET-7f3a"


def _build(path: str, roots: list[str], **args: Any) -> Any:
    ref = ComponentRef(name="tensors", args={"path": path, **args})
    return registry.build_dataset(ref, seed=0, data_roots=roots)


class Listener:
    """A real TCP server that records every connection and answers like an FTP server
    whose banner holds a secret (what a probe would read back in the job's error)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[int] = []  # client ports, in the order accepted
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, (_, port) = self.sock.accept()
            except OSError:
                return
            self.peers.append(port)
            with contextlib.suppress(OSError):
                conn.sendall(f"220 {SECRET} banner\r\n".encode())
            conn.close()

    def connections_besides_a_sentinel(self) -> list[int]:
        """Connect once more and wait until that is accepted: the backlog is FIFO, so every
        earlier connection has been recorded by then."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            mine = s.getsockname()[1]
            wait_until(lambda: mine in self.peers, 10, "the sentinel connection to be accepted")
        return [p for p in self.peers if p != mine]

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


def test_a_dataset_url_never_connects_anywhere_outside_the_roots(
    tmp_path: Path, listener: Listener
) -> None:
    url = f"ftp://127.0.0.1:{listener.port}/x.csv"
    with pytest.raises(InvalidSpecError) as err:
        _build(url, [str(tmp_path)])
    assert err.value.code == "invalid_spec" and not err.value.retryable
    assert err.value.message.startswith("dataset.args.path: ")
    assert "protocol 'ftp' is not allowed" in err.value.message
    assert SECRET not in err.value.message
    assert listener.connections_besides_a_sentinel() == []


def test_an_allowed_ftp_root_does_not_open_the_host_for_other_paths(
    listener: Listener,
) -> None:
    root = f"ftp://127.0.0.1:{listener.port}/allowed"
    other_port = f"ftp://127.0.0.1:{listener.port + 1 if listener.port < 65535 else 1}/allowed"
    for path, roots in [
        (f"ftp://127.0.0.1:{listener.port}/other/x.csv", [root]),
        (f"ftp://127.0.0.1:{listener.port}/allowed/../other/x.csv", [root]),
        (f"ftp://127.0.0.1:{listener.port}/allowed/x.csv", [other_port]),
        (f"ftp://localhost:{listener.port}/allowed/x.csv", [root]),
    ]:
        with pytest.raises(InvalidSpecError, match="outside the allowed data roots"):
            _build(path, roots)
    assert listener.connections_besides_a_sentinel() == []


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "operator-data-root"
    path.mkdir()
    return path


def _assert_clean(message: str, root: Path) -> None:
    assert SECRET not in message
    assert str(root) not in message and "operator-data-root" not in message
    assert str(Path.cwd()) not in message


def test_a_csv_that_does_not_parse_is_described_not_quoted(root: Path) -> None:
    (root / "d.csv").write_text(f"1.0,2.0,0\n3.0,{SECRET},1\n")
    with pytest.raises(InvalidSpecError) as err:
        _build("d.csv", [str(root)])
    assert err.value.message.startswith("dataset.args.path: cannot load 'd.csv' as .csv")
    assert "every cell must be a number" in err.value.message
    _assert_clean(err.value.message, root)


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("d.npz", f"PK{SECRET}".encode(), "not a NumPy .npz archive"),
        ("d.pt", SECRET.encode(), "not a readable PyTorch file"),
        ("d.csv", b"\xff\xfe" + SECRET.encode(), "not UTF-8 text"),
    ],
)
def test_other_broken_files_are_described_not_quoted(
    root: Path, name: str, content: bytes, problem: str
) -> None:
    (root / name).write_bytes(content)
    with pytest.raises(InvalidSpecError) as err:
        _build(name, [str(root)])
    assert problem in err.value.message
    _assert_clean(err.value.message, root)


def test_missing_and_outside_files_do_not_show_the_roots(root: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError) as err:
        _build("team/absent.npz", [str(root)])
    assert err.value.message == (
        "dataset.args.path: no such file under the data roots: 'team/absent.npz'"
    )
    with pytest.raises(InvalidSpecError) as err:
        _build("/etc/passwd", [str(root)])
    assert "outside the allowed data roots" in err.value.message
    _assert_clean(err.value.message, root)


def test_relative_paths_are_found_under_any_root(root: Path, tmp_path: Path) -> None:
    second = tmp_path / "second"
    (second / "team").mkdir(parents=True)
    x = np.zeros((6, 2), np.float32)
    np.savez(second / "team" / "d.npz", x=x, y=np.arange(6) % 3)
    ds = _build("team/d.npz", [str(root), str(second)])
    assert ds.info.input_shape == (2,) and ds.info.num_classes == 3
