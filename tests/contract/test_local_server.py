"""The record `amptrain up` leaves for the command-line client: followed only while that
`up` lives, and only to an http(s) URL, however the file was edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amptrain.contract.local_server import (
    RECORD_MAX_BYTES,
    RECORD_NAME,
    client_url,
    remove_record,
    running_server,
    write_record,
)


def test_a_live_ups_record_is_found_and_removed_by_its_owner(tmp_path: Path) -> None:
    write_record(tmp_path, "http://127.0.0.1:18400", os.getpid())
    found = running_server(tmp_path)
    assert found is not None and found.url == "http://127.0.0.1:18400"
    remove_record(tmp_path, os.getpid() + 1)  # another process's stop leaves it
    assert running_server(tmp_path) is not None
    remove_record(tmp_path, os.getpid())
    assert not (tmp_path / RECORD_NAME).exists() and running_server(tmp_path) is None


def test_a_dead_ups_record_is_not_followed(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)  # fmt: skip
    write_record(tmp_path, "http://127.0.0.1:18400", int(gone.stdout))
    assert running_server(tmp_path) is None


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "javascript:alert(1)",
        "ws://127.0.0.1:8000",
        "http://",
        "http://user:secret@127.0.0.1:8000",
        "http://127.0.0.1:8000/?next=evil",
        "http://127.0.0.1:8000/\x1b[31m",
        "http://127.0.0.1 :8000",
        "http://" + "a" * 300 + ":8000",
    ],
)
def test_a_tampered_record_is_ignored(tmp_path: Path, url: str) -> None:
    (tmp_path / RECORD_NAME).write_text(json.dumps({"url": url, "pid": os.getpid()}))
    assert running_server(tmp_path) is None


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '{"url": "http://127.0.0.1:1"}', '{"url": 5, "pid": 1}'],
)
def test_a_record_that_is_not_one_is_ignored(tmp_path: Path, text: str) -> None:
    (tmp_path / RECORD_NAME).write_text(text)
    assert running_server(tmp_path) is None


def test_an_oversized_record_is_not_read(tmp_path: Path) -> None:
    body = json.dumps({"url": "http://127.0.0.1:8000", "pid": os.getpid()})
    (tmp_path / RECORD_NAME).write_text(body + " " * RECORD_MAX_BYTES)
    assert running_server(tmp_path) is None


def test_a_wildcard_bind_is_reached_on_loopback() -> None:
    assert client_url("0.0.0.0", 18400) == "http://127.0.0.1:18400"
    assert client_url("::", 80) == "http://[::1]:80"
    assert client_url("10.1.2.3", 8000) == "http://10.1.2.3:8000"
