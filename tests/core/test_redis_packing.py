"""The Redis client's pipelines (``amptrain.core.redis.client``): a command of bytes and str
arguments is packed by hiredis in one call (the recorder's XACK of thousands of ids), and
what reaches the server is exactly what redis-py alone sends, over TCP and the unix socket,
odd arguments included."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.redis import client
from tests.support.stack import free_port

ODD = [
    ("XADD", "amptrain:t:s", "*", "kind", "metric", "packed", bytes(range(256))),
    ("SET", "amptrain:t:k", "a value\r\nwith a line break and é", "EX", 30),  # an int: redis-py
    ("CONFIG GET", "maxmemory"),  # a two-word name: redis-py splits it
    ("SET", b"amptrain:t:b", b"", "PX", "30000"),
    ("GET", "amptrain:t:k"),
    ("XACK", "amptrain:t:s", "g", *[f"{i}-0".encode() for i in range(1, 5000)]),
    ("SET", "amptrain:t:f", 1.5),  # a float: redis-py
]


def _both(url: str) -> tuple[redis.Redis, redis.Redis]:
    return client(url), redis.Redis.from_url(url)


@pytest.mark.parametrize("scheme", ["tcp", "unix"])
def test_pipelines_send_what_redis_py_sends_and_get_the_same_replies(
    redis_server: Any, scheme: str
) -> None:
    server = redis_server
    if scheme == "tcp":
        server = EmbeddedRedis(
            redis_server.directory / "tcp", bind=["127.0.0.1"], port=free_port()
        ).start()
    try:
        url = server.url if scheme == "unix" else server.tcp_url
        ours, theirs = _both(url)
        mine = ours.connection_pool.get_connection()
        plain = theirs.connection_pool.get_connection()
        assert type(mine) is not type(plain)  # the packing connection is in use
        assert b"".join(mine.pack_commands(ODD)) == b"".join(plain.pack_commands(ODD))
        ours.connection_pool.release(mine)
        theirs.connection_pool.release(plain)

        replies = []
        for c in (ours, theirs):
            c.delete("amptrain:t:s", "amptrain:t:k", "amptrain:t:b", "amptrain:t:f")
            c.xgroup_create("amptrain:t:s", "g", id="0", mkstream=True)
            pipe = c.pipeline(transaction=False)
            for args in ODD:
                pipe.execute_command(*args)
            got = pipe.execute(raise_on_error=False)
            replies.append([r for i, r in enumerate(got) if i != 0])  # the XADD's id differs
        assert replies[0] == replies[1]
        assert replies[0][3] == "a value\r\nwith a line break and é".encode()
    finally:
        if server is not redis_server:
            server.stop()


def test_an_argument_that_is_no_utf_8_fails_as_with_redis_py(session_redis: Any) -> None:
    ours, theirs = _both(session_redis.url)
    for c in (ours, theirs):
        pipe = c.pipeline(transaction=False)
        pipe.set("amptrain:t:bad", "\ud800")
        with pytest.raises(UnicodeEncodeError):
            pipe.execute()
    assert ours.ping()  # the connection still serves
