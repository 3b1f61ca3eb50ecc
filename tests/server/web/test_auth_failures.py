"""The failed-authentication limiter against a real uvicorn: it throttles failures only (a
valid token always passes), counts an address X-Forwarded-For names only when the proxy
sending it is configured, counts WebSocket handshakes and SSE streams like requests, and
logs what a client sent escaped."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from pydantic import ValidationError

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.logs import shown
from amptrain.core.settings import Settings
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack

LIMIT = 30  # AMPTRAIN_AUTH_FAILURE_RATE_LIMIT's default: 30/minute
BAD = {"Authorization": "Bearer not-a-token"}


def start(stack: Stack, **env: str) -> Stack:
    stack.env.pop("FORWARDED_ALLOW_IPS", None)  # uvicorn's own variable must not matter
    stack.env.update(env)
    stack.start_api()
    return stack


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    stack = start(Stack(tmp_path, database_url, redis_server))
    yield stack
    stack.close()


@pytest.fixture
def proxied(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    """The API behind a proxy at 127.0.0.1 (the test client plays it)."""
    stack = start(
        Stack(tmp_path, database_url, redis_server), AMPTRAIN_FORWARDED_ALLOW_IPS="127.0.0.1"
    )
    yield stack
    stack.close()


def client(stack: Stack, local: str = "127.0.0.1", **headers: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=local)
    base = str(stack.client.base_url)
    return httpx.Client(base_url=base, transport=transport, headers=headers, timeout=30)


async def handshake(url: str, token: str, **headers: str) -> int:
    """The HTTP status a WebSocket upgrade was answered with (101: opened)."""
    try:
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Bearer {token}", **headers}
        ):
            return 101
    except websockets.InvalidStatus as exc:
        if exc.response.status_code == 429:
            assert 1 <= int(exc.response.headers["Retry-After"]) <= 60
            assert b'"too_many_requests"' in exc.response.body
        return exc.response.status_code


def test_a_valid_token_passes_from_an_address_over_the_limit(stack: Stack) -> None:
    job = stack.submit(cpu_job())["id"]
    with client(stack) as guesser:
        for i in range(LIMIT):  # requests and SSE streams count alike
            path = "/jobs" if i % 2 else f"/jobs/{job}/stream"
            r = guesser.get(path, headers={"Authorization": f"Bearer guess-{i}"})
            assert r.status_code == 401, r.text
        r = guesser.get("/jobs", headers=BAD)
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert r.json()["detail"]["limit"] == "30 per 1 minute"
        # The same address with a valid token: served (was 429 for the whole window).
        assert guesser.get("/jobs", headers=stack.client.headers).status_code == 200
        assert guesser.get("/me", headers=stack.client.headers).status_code == 200
        # Its failures are still refused, without a token too.
        assert guesser.get("/jobs", headers=BAD).status_code == 429
        assert guesser.get("/jobs").status_code == 429
    with client(stack, "127.0.0.2") as other:  # another address is not affected
        assert other.get("/jobs", headers=BAD).status_code == 401
    log = (stack.root / "api.log").read_text()
    assert log.count("authentication failed from 127.0.0.1: unknown bearer token") == LIMIT
    assert "authentication failures from 127.0.0.1 passed 30 per 1 minute" in log


def test_x_forwarded_for_is_ignored_unless_its_proxy_is_configured(stack: Stack) -> None:
    with client(stack) as c:
        codes = [
            c.get("/jobs", headers={**BAD, "X-Forwarded-For": f"10.0.0.{i}"}).status_code
            for i in range(90)
        ]
        # Was 90 x 401: each forged header was an address of its own.
        assert codes == [401] * LIMIT + [429] * (90 - LIMIT)
        valid = {**stack.client.headers, "X-Forwarded-For": "10.0.0.1"}
        assert c.get("/jobs", headers=valid).status_code == 200
    log = (stack.root / "api.log").read_text()
    assert "authentication failures from 127.0.0.1 passed" in log
    assert "from 10.0.0." not in log


def test_x_forwarded_for_from_a_configured_proxy_is_the_address(proxied: Stack) -> None:
    blocked = {"X-Forwarded-For": "203.0.113.9"}
    with client(proxied) as proxy:
        for _ in range(LIMIT):
            assert proxy.get("/jobs", headers={**BAD, **blocked}).status_code == 401
        assert proxy.get("/jobs", headers={**BAD, **blocked}).status_code == 429
        other = {**BAD, "X-Forwarded-For": "203.0.113.10"}
        assert proxy.get("/jobs", headers=other).status_code == 401
        assert proxy.get("/jobs", headers={**proxied.client.headers, **blocked}).status_code == 200
        # A forwarded value is logged escaped, in our lines and in uvicorn's access log.
        hostile = {"X-Forwarded-For": "0003d140<script>'\"\\"}
        assert proxy.get("/jobs", headers={**BAD, **hostile}).status_code == 401
    with client(proxied, "127.0.0.2") as direct:  # not the proxy: its header is ignored
        assert direct.get("/jobs", headers={**BAD, **blocked}).status_code == 401
    # So is a refused handshake's job id: the client's (decoded) path.
    url = f"ws://127.0.0.1:{proxied.port}/jobs/%3Cscript%3E%0Ax/ws"
    assert asyncio.run(handshake(url, "bad", **hostile)) == 403
    log = (proxied.root / "api.log").read_text()
    assert "authentication failures from 203.0.113.9 passed" in log
    assert "authentication failed from 203.0.113.10: unknown bearer token" in log
    assert r"authentication failed from 0003d140\x3cscript\x3e\x27\x22\x5c: unknown" in log
    assert "<script>" not in log


def test_websocket_handshakes_count_and_a_valid_one_still_opens(stack: Stack) -> None:
    job = stack.submit(cpu_job())["id"]
    url = f"ws://127.0.0.1:{stack.port}/jobs/{job}/ws"

    async def scenario() -> list[int]:
        bad = [await handshake(url, f"guess-{i}") for i in range(LIMIT + 1)]
        return [*bad, await handshake(url, stack.token), await handshake(url, "guess-again")]

    codes = asyncio.run(scenario())
    # Was 31 x 403: handshakes were never counted.
    assert codes == [403] * LIMIT + [429, 101, 429]
    assert stack.client.get("/jobs", headers=BAD).status_code == 429  # one limiter for all
    log = (stack.root / "api.log").read_text()
    assert log.count("authentication failed from 127.0.0.1: unknown bearer token") == LIMIT


def test_a_bad_proxy_setting_is_refused_naming_it(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).forwarded_allow_ips == []  # trust no proxy
    ok = Settings(data_dir=tmp_path, forwarded_allow_ips="10.0.0.0/8, 127.0.0.1,::1")
    assert ok.forwarded_allow_ips == ["10.0.0.0/8", "127.0.0.1", "::1"]
    for bad in ("proxy.example", "10.0.0.1/8", "1.2.3.4\n<script>", "*,10.0.0.1", "127.0.0.1 x"):
        with pytest.raises(ValidationError, match="AMPTRAIN_FORWARDED_ALLOW_IPS"):
            Settings(data_dir=tmp_path, forwarded_allow_ips=bad)
    env = {
        **os.environ,
        "AMPTRAIN_DATA_DIR": str(tmp_path),
        "AMPTRAIN_FORWARDED_ALLOW_IPS": "nginx",
    }
    api = [sys.executable, "-m", "amptrain.cli.main", "api", "--port", "1"]
    result = subprocess.run(api, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "AMPTRAIN_FORWARDED_ALLOW_IPS: 'nginx' is not an IP address" in result.stderr


def test_client_values_are_logged_escaped() -> None:
    assert shown("127.0.0.1") == "127.0.0.1" and shown("[::1]:8000") == "[::1]:8000"
    assert shown("a<b>\n\x1b[0m") == r"a\x3cb\x3e\x0a\x1b[0m"
    assert shown("é☃") == r"\xe9\u2603"
    assert shown("x" * 500, limit=10) == "x" * 10 + "..."
