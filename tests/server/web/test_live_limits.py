"""Live watchers per user are limited across API processes (close 4429 / HTTP 429), a
revoked or expired token ends open streams at their next message (close 4401), and
every close is logged with its reason."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import websockets
from pydantic import ValidationError

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.settings import Settings
from amptrain.store import tokens
from amptrain.store.db import make_engine, make_session_factory
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack, free_port, wait_until

LIMIT = 3


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env.update(
        AMPTRAIN_MAX_LIVE_CONNECTIONS_PER_USER=str(LIMIT),
        AMPTRAIN_LIVE_HEARTBEAT_SECONDS="0.3",  # messages keep flowing on a queued job
        AMPTRAIN_TOKEN_RECHECK_SECONDS="0.3",
    )
    stack.start_api()
    yield stack
    stack.close()


def make_token(stack: Stack, name: str, expires_in: timedelta | None = None) -> str:
    engine = make_engine(stack.env["AMPTRAIN_DATABASE_URL"])
    with make_session_factory(engine).begin() as s:
        token = tokens.create_token(s, name, expires_in=expires_in)
    engine.dispose()
    return token


def revoke(stack: Stack, name: str) -> None:
    engine = make_engine(stack.env["AMPTRAIN_DATABASE_URL"])
    with make_session_factory(engine).begin() as s:
        tokens.revoke_token(s, name)
    engine.dispose()


def submit(stack: Stack, token: str) -> str:
    r = httpx.post(
        f"{stack.client.base_url}/jobs",
        json=cpu_job(),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def url(port: int, job_id: str) -> str:
    return f"ws://127.0.0.1:{port}/jobs/{job_id}/ws"


async def connect(port: int, job_id: str, token: str) -> websockets.ClientConnection:
    ws = await websockets.connect(
        url(port, job_id), additional_headers={"Authorization": f"Bearer {token}"}
    )
    await asyncio.wait_for(ws.recv(), 10)  # the first message: the stream is being served
    return ws


async def close_of(ws: websockets.ClientConnection, timeout: float = 10) -> tuple[int, str]:
    """Read until the server closes; its close code and reason."""
    with pytest.raises(websockets.ConnectionClosed):
        async with asyncio.timeout(timeout):
            while True:
                await ws.recv()
    assert ws.close_code is not None
    return ws.close_code, ws.close_reason or ""


def test_live_watchers_per_user_are_limited_across_api_processes(stack: Stack) -> None:
    second = free_port()
    stack.spawn("api2", ["api", "--host", "127.0.0.1", "--port", str(second)])
    wait_until(lambda: _up(second), 30, "the second API process")
    alice, bob = make_token(stack, "alice"), make_token(stack, "bob")
    job, bobs = submit(stack, alice), submit(stack, bob)

    async def scenario() -> None:
        # Two watchers through one process, one through the other: the user's whole limit.
        held = [
            await connect(stack.port, job, alice),
            await connect(stack.port, job, alice),
            await connect(second, job, alice),
        ]
        for port in (stack.port, second):
            refused = await websockets.connect(
                url(port, job), additional_headers={"Authorization": f"Bearer {alice}"}
            )
            code, reason = await close_of(refused)
            assert code == 4429 and reason.startswith("too many live connections"), reason
            assert f"at most {LIMIT}" in reason
        sse = httpx.get(
            f"{stack.client.base_url}/jobs/{job}/stream",
            headers={"Authorization": f"Bearer {alice}"},
            timeout=30,
        )
        assert sse.status_code == 429 and sse.json()["detail"]["limit"] == LIMIT
        # Someone else, and the admin, are not affected.
        others = [await connect(stack.port, bobs, bob), await connect(stack.port, job, stack.token)]
        # A closed watcher frees its place.
        await held.pop().close()
        again = await _eventually_connect(stack.port, job, alice)
        for ws in [*held, *others, again]:
            await ws.close()

    asyncio.run(scenario())
    log = (stack.root / "api.log").read_text() + (stack.root / "api2.log").read_text()
    assert "live WebSocket watcher closed: too many live connections" in log
    assert "live SSE watcher closed: too many live connections" in log
    assert "live WebSocket watcher closed: client disconnected (code none" in log


async def _eventually_connect(port: int, job: str, token: str) -> websockets.ClientConnection:
    for _ in range(50):  # the slot is released as the server notices the close
        ws = await websockets.connect(
            url(port, job), additional_headers={"Authorization": f"Bearer {token}"}
        )
        try:
            await asyncio.wait_for(ws.recv(), 10)
            return ws
        except websockets.ConnectionClosed:
            await asyncio.sleep(0.1)
    raise AssertionError("the freed place was never given back")


def test_a_revoked_or_expired_token_ends_open_streams(stack: Stack) -> None:
    carol = make_token(stack, "carol")
    brief = make_token(stack, "brief", expires_in=timedelta(seconds=4))
    job, briefs = submit(stack, carol), submit(stack, brief)

    async def scenario() -> None:
        ws = await connect(stack.port, job, carol)
        expiring = await connect(stack.port, briefs, brief)
        revoke(stack, "carol")
        assert await close_of(ws) == (4401, "token revoked")
        assert await close_of(expiring) == (4401, "token expired")

    asyncio.run(scenario())

    dave = make_token(stack, "dave")
    dave_job = submit(stack, dave)
    with httpx.stream(
        "GET",
        f"{stack.client.base_url}/jobs/{dave_job}/stream",
        headers={"Authorization": f"Bearer {dave}"},
        timeout=30,
    ) as sse:
        lines = sse.iter_lines()
        assert next(lines).startswith(("id: ", "event: "))  # streaming
        revoke(stack, "dave")
        rest = list(lines)  # the server ends the stream
    error = rest[rest.index("event: error") + 1]
    assert json.loads(error.removeprefix("data: ")) == {
        "error": "unauthorized",
        "detail": "token revoked",
    }

    # The stream's end reaches the client before its close is logged.
    log = wait_until(
        lambda: "SSE watcher closed" in (t := (stack.root / "api.log").read_text()) and t,
        10,
        "the SSE close to be logged",
    )
    assert "live WebSocket watcher closed: token revoked (code 4401" in log
    assert "live WebSocket watcher closed: token expired (code 4401" in log
    assert "live SSE watcher closed: token revoked (code none" in log


def test_one_user_cannot_hold_the_live_hubs_redis_connections(tmp_path: Path) -> None:
    # The hub has 256 Redis connections (one per watched job); a user may hold at most half.
    assert Settings(data_dir=tmp_path, max_live_connections_per_user=128)
    with pytest.raises(ValidationError, match="max_live_connections_per_user"):
        Settings(data_dir=tmp_path, max_live_connections_per_user=129)


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    except httpx.TransportError:
        return False
