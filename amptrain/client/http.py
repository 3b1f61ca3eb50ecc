"""A Python client of the amptrain HTTP and WebSocket API (used by ``amptrain submit`` & co).

Where the server comes from, first match wins (the client says which in its errors):

1. the CLI's ``--url``;
2. the environment's ``AMPTRAIN_URL``;
3. a config file, ``$XDG_CONFIG_HOME/amptrain/config.toml`` (default
   ``~/.config/amptrain/config.toml``), e.g. ``url = "http://gpu-box:8000"`` and
   ``token = "..."``; ``AMPTRAIN_CONFIG`` names another file;
4. the server a running ``amptrain up`` recorded in the data directory
   (``$AMPTRAIN_DATA_DIR/server.json``, default ``./.amptrain/server.json``), followed only
   while that ``up`` is alive and only to an http(s) URL
   (:mod:`amptrain.contract.local_server`);
5. ``http://127.0.0.1:8000``.

The token: ``--token``, ``AMPTRAIN_TOKEN``, the config file, else the admin token
``amptrain up`` saved in the same data directory (``admin-token``).

:meth:`Client.watch` follows a job over the WebSocket and reconnects by itself after a
dropped connection or a ``gap``, resuming from the last cursor it received, so the
caller sees every message once.
"""

from __future__ import annotations

import asyncio
import json
import os
import tomllib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from amptrain.contract.job_ids import JOB_ID, JOB_ID_PREFIX
from amptrain.contract.local_server import RECORD_NAME, running_server

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class ClientConfig:
    url: str
    token: str | None
    source: str = field(default="given", compare=False)
    """Where ``url`` came from, as errors name it (``--url``, ``AMPTRAIN_URL``, the config
    file, ``amptrain up``'s record, the default)."""

    @property
    def where(self) -> str:
        """``http://127.0.0.1:18400 (from amptrain up, pid 4242)``: the URL and its source."""
        return f"{self.url} ({self.source})"


def config_path() -> Path:
    if os.environ.get("AMPTRAIN_CONFIG"):
        return Path(os.environ["AMPTRAIN_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "amptrain" / "config.toml"


def data_dir() -> Path:
    """The data directory ``amptrain up`` uses here by default (its token and record)."""
    return Path(os.environ.get("AMPTRAIN_DATA_DIR") or ".amptrain")


def resolve_config(url: str | None = None, token: str | None = None) -> ClientConfig:
    """The server URL and token, by the precedence in the module docstring."""
    source = "from --url"
    if not url and os.environ.get("AMPTRAIN_URL"):
        url, source = os.environ["AMPTRAIN_URL"], "from AMPTRAIN_URL"
    token = token or os.environ.get("AMPTRAIN_TOKEN")
    path = config_path()
    if (not url or not token) and path.is_file():
        data = tomllib.loads(path.read_text())
        if not url and data.get("url"):
            url, source = data["url"], f"from {path}"
        token = token or data.get("token")
    if not url:
        up = running_server(data_dir())
        if up is not None:
            url, source = up.url, f"from amptrain up, pid {up.pid}"
        else:
            url = DEFAULT_URL
            source = f"the default: no running amptrain up recorded in {data_dir() / RECORD_NAME}"
    if not token:
        token = _saved_admin_token()
    return ClientConfig(url.rstrip("/"), token, source)


def _saved_admin_token() -> str | None:
    try:
        return (data_dir() / "admin-token").read_text().strip() or None
    except OSError:
        return None


AMBIGUOUS_SHOWN = 5
"""How many of the ids an ambiguous prefix matches an error lists."""


class ApiError(Exception):
    """An error answer from the server: HTTP status, ``error`` code and ``detail``."""

    def __init__(self, status: int, code: str, detail: Any) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail = status, code, detail


def _raise_for(response: httpx.Response) -> None:
    """ApiError for an error answer (its ``error`` and ``detail``)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        raise ApiError(response.status_code, "http_error", response.text) from None
    raise ApiError(response.status_code, body.get("error", "?"), body.get("detail"))


class Client:
    """``Client(resolve_config())``: jobs over HTTP, live telemetry over the WebSocket."""

    def __init__(self, config: ClientConfig, timeout: float = 30.0) -> None:
        self.config = config
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self.http = httpx.Client(base_url=config.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"{self.config.where}: {exc}") from None
        _raise_for(response)
        return response.json()

    def download(self, path: str, params: dict[str, Any], out: BinaryIO) -> int:
        """Stream ``GET path`` into ``out`` as it arrives (a whole-run export may not fit
        in memory); the bytes written. ApiError on an error answer or a cut connection."""
        written = 0
        try:
            with self.http.stream("GET", path, params=params) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                for piece in response.iter_bytes():
                    out.write(piece)
                    written += len(piece)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"{self.config.where}: {exc}") from None
        return written

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return dict(self._call("POST", "/jobs", json=spec, headers=headers))

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/jobs/{job_id}"))

    def jobs(
        self, status: str | None = None, limit: int = 50, id_prefix: str | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
        if id_prefix is not None:
            params["id_prefix"] = id_prefix
        return list(self._call("GET", "/jobs", params=params)["items"])

    def resolve(self, ref: str) -> str:
        """The whole id of the job ``ref`` names: the id itself, or a unique prefix of one
        (``j_6ef6d2``, as a narrow ``amptrain jobs`` shows it). Raises ApiError
        ``not_found`` when none matches, ``ambiguous`` when several do."""
        if JOB_ID.fullmatch(ref):
            return ref
        if not JOB_ID_PREFIX.fullmatch(ref):
            raise ApiError(404, "not_found", f"{ref[:40]!r} is not a job id (j_ and hex digits)")
        found = [j["id"] for j in self.jobs(limit=AMBIGUOUS_SHOWN + 1, id_prefix=ref)]
        if len(found) == 1:
            return found[0]
        if not found:
            raise ApiError(404, "not_found", f"no job of yours has an id starting {ref}")
        more = ", ..." if len(found) > AMBIGUOUS_SHOWN else ""
        shown = ", ".join(found[:AMBIGUOUS_SHOWN])
        raise ApiError(409, "ambiguous", f"{ref} starts several job ids: {shown}{more}")

    def newest_cursor(self, job_id: str) -> str | None:
        """The cursor of the job's newest recorded point (None before the first): where a
        watch of a running job starts by default."""
        page = self._call(
            "GET", f"/jobs/{job_id}/metrics", params={"max_points": 1, "fields": "step"}
        )
        return page.get("next_cursor")

    def export(self, job_id: str, name: str, step: int | None = None) -> dict[str, Any]:
        """Copy a checkpoint's weights (the newest checkpoint's when ``step`` is None) into
        the caller's weights root as ``name``; ``{"path", "size"}``, ``path`` for a spec's
        ``weights.path``."""
        if step is None:
            listed = self._call("GET", f"/jobs/{job_id}/checkpoints")["items"]
            if not listed:
                raise ApiError(404, "not_found", f"job {job_id} has no checkpoint")
            step = int(listed[-1]["step"])
        path = f"/jobs/{job_id}/checkpoints/{step}/export"
        return dict(self._call("POST", path, json={"name": name}))

    def fork(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /jobs/{id}/fork`` (``{"step", "overrides", "name"}``): the new job."""
        return dict(self._call("POST", f"/jobs/{job_id}/fork", json=body))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/jobs/{job_id}/cancel"))

    def alert_rules(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/alerts/rules", params={"limit": 200})["items"])

    def add_alert_rule(self, rule: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("POST", "/alerts/rules", json=rule))

    def delete_alert_rule(self, rule_id: int) -> None:
        try:
            response = self.http.delete(f"/alerts/rules/{rule_id}")
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"{self.config.where}: {exc}") from None
        if response.status_code >= 400:
            body = response.json()
            raise ApiError(response.status_code, body.get("error", "?"), body.get("detail"))

    def alert_deliveries(self, rule_id: int, limit: int = 50) -> list[dict[str, Any]]:
        page = self._call("GET", f"/alerts/rules/{rule_id}/deliveries", params={"limit": limit})
        return list(page["items"])

    def events(self, job_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        after = "0"
        while True:
            page = self._call("GET", f"/jobs/{job_id}/events", params={"after": after})
            items.extend(page["items"])
            if not page["items"]:
                return items
            after = page["next_cursor"]

    def ws_url(self, job_id: str, after: str | None) -> str:
        base = self.config.url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        return f"{base}/jobs/{job_id}/ws" + (f"?after={after}" if after else "")

    async def watch(
        self,
        job_id: str,
        after: str | None = None,
        *,
        retries: int = 20,
        on_reconnect: Callable[[str | None, str], None] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every message of the job once (heartbeats and gaps are handled here), ending
        with ``end``. Reconnects with the last cursor after a drop; gives up (raising
        ApiError) after ``retries`` failed attempts in a row or on a refused handshake."""
        cursor, failures = after, 0
        headers = {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}
        while True:
            reason = "connection lost"
            try:
                async with websockets.connect(
                    self.ws_url(job_id, cursor), additional_headers=headers, open_timeout=15
                ) as ws:
                    async for raw in ws:
                        failures = 0
                        msg = json.loads(raw)
                        if msg["type"] == "heartbeat":
                            continue
                        if msg["type"] == "gap":
                            reason = "fell behind"
                            cursor = msg["cursor"] or cursor
                            break
                        cursor = msg["cursor"] or cursor
                        yield msg
                        if msg["type"] == "end":
                            return
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403, 404):
                    raise ApiError(status, "refused", f"not allowed to watch {job_id}") from None
                reason = f"HTTP {status}"
            except (ConnectionClosed, OSError, TimeoutError) as exc:
                reason = f"{type(exc).__name__}"
            failures += 1
            if failures > retries:
                raise ApiError(0, "unreachable", f"gave up watching {job_id}: {reason}")
            if on_reconnect is not None:
                on_reconnect(cursor, reason)
            await asyncio.sleep(min(0.2 * 2 ** min(failures, 5), 5.0))
