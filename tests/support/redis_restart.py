"""Restarting a test's private Redis, as an outage does: with its append-only file kept
(a restart) or deleted first (a Redis that lost its data)."""

from __future__ import annotations

from pathlib import Path

import redis

from amptrain.cli.embedded_redis import EmbeddedRedis


def restart(server: EmbeddedRedis, *, lose_data: bool) -> redis.Redis:
    """Kill ``server`` and start it again; a fresh client to it."""
    server.kill()
    if lose_data:
        for f in Path(server.directory).glob("appendonly*"):
            f.unlink()
    server.start()
    return redis.Redis.from_url(server.url)
