"""The record ``amptrain up`` leaves in its data directory so that the command-line client
finds the server it started (``amptrain up --port 18400`` then ``amptrain jobs``).

``up`` writes :data:`RECORD_NAME` (its URL and its own pid) when the API starts and removes
it when it stops; a client follows it only while that process is alive, and only to an
``http``/``https`` URL: a record edited to name ``file:`` or another scheme is ignored.
Torch-free and server-free: the client reads it with the standard library and pydantic.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError, field_validator

RECORD_NAME = "server.json"
"""The record's file name in the data directory (beside ``admin-token``)."""
RECORD_MAX_BYTES = 4096
"""A longer file is not a record ``up`` wrote: it is not read."""
URL_MAX = 200
"""The longest URL a record may name."""


class LocalServer(BaseModel):
    """What ``up`` records: where its API listens and which process ``up`` is."""

    url: str = Field(max_length=URL_MAX)
    """The API's base URL as a client on this machine reaches it."""
    pid: int = Field(gt=0, lt=2**31)
    """``amptrain up``'s process id: the record is followed only while it lives."""

    @field_validator("url")
    @classmethod
    def _http_only(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("must not carry credentials, a query or a fragment")
        if any(ch.isspace() or not ch.isprintable() for ch in url):
            raise ValueError("must not contain spaces or control characters")
        return url.rstrip("/")


def client_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for an API bound to ``host``: a wildcard
    address (``0.0.0.0``, ``::``) is reached on loopback, an IPv6 literal in brackets."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def write_record(data_dir: Path, url: str, pid: int) -> Path:
    """Write the record atomically (a reader never sees half of it); its path."""
    record = LocalServer(url=url, pid=pid)
    path = data_dir / RECORD_NAME
    tmp = path.with_name(f".{RECORD_NAME}.{pid}")
    tmp.write_text(record.model_dump_json())
    tmp.replace(path)
    return path


def remove_record(data_dir: Path, pid: int) -> None:
    """Remove the record if it is still this process's (a newer ``up`` may own it)."""
    path = data_dir / RECORD_NAME
    found = _read(path)
    if found is not None and found.pid == pid:
        path.unlink(missing_ok=True)


def running_server(data_dir: Path) -> LocalServer | None:
    """The server a live ``up`` recorded in ``data_dir``; None when there is no record,
    it is not one ``up`` could have written (too long, not JSON, a URL that is not
    http(s)), or its process is gone."""
    found = _read(data_dir / RECORD_NAME)
    return found if found is not None and _alive(found.pid) else None


def _read(path: Path) -> LocalServer | None:
    try:
        with path.open("rb") as f:
            raw = f.read(RECORD_MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > RECORD_MAX_BYTES:
        return None
    try:
        return LocalServer.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    except OSError:
        return False
    return True
