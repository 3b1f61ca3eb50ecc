"""Per-user limits shared by every API process through Redis.

* The write rate: the ``limits`` library's moving window (exact, one short list per
  user) over the windows in ``AMPTRAIN_WRITE_RATE_LIMIT``.
* Concurrent live watchers (WebSocket + SSE): a sorted set of leases per user; a
  lease lapses unless its connection refreshes it, so a crashed API process frees
  its users' slots within :data:`LiveSlots.LEASE_S`.

Both fail open: a Redis outage delays jobs anyway and must not also lock every user
out of the API (it is logged).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from dataclasses import dataclass

import redis
from limits import RateLimitItem, parse_many
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

from amptrain.core.redis import Keys

log = logging.getLogger(__name__)


def _user_key(user: str) -> str:
    # Token names are free text: key by a digest.
    return hashlib.sha256(user.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Refused:
    """A limit said no: which one, and when to try again."""

    limit: str
    retry_after_s: int


class WriteLimiter:
    """``hit(user)`` for each write; a :class:`Refused` when the user is over a window."""

    def __init__(self, spec: str, client: redis.Redis) -> None:
        try:
            self.items: list[RateLimitItem] = parse_many(spec)
        except ValueError:
            raise ValueError(
                f"AMPTRAIN_WRITE_RATE_LIMIT={spec[:60]!r} is not like '120/minute' or "
                "'10/second;1000/hour'"
            ) from None
        storage = RedisStorage(
            "redis://", connection_pool=client.connection_pool, key_prefix=Keys.RATE_LIMITS
        )
        self.limiter = MovingWindowRateLimiter(storage)

    def hit(self, user: str) -> Refused | None:
        key = _user_key(user)
        try:
            for item in self.items:
                if not self.limiter.hit(item, key):
                    reset = self.limiter.get_window_stats(item, key).reset_time
                    return Refused(str(item), max(1, math.ceil(reset - time.time())))
        except redis.RedisError as exc:
            log.warning("write rate limit not checked (Redis: %s)", type(exc).__name__)
        return None


_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[3]) then return {0, n} end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return {1, n + 1}
"""


class LiveSlots:
    """At most ``limit`` concurrent watchers per user, across API processes."""

    LEASE_S = 60.0
    """A held slot lapses this long after its last refresh (a crashed process's slots)."""
    REFRESH_S = LEASE_S / 3

    def __init__(self, client: redis.Redis, limit: int) -> None:
        self.client = client
        self.limit = limit
        self._acquire = client.register_script(_ACQUIRE)

    def acquire(self, user: str) -> tuple[str | None, int]:
        """``(slot id, in use)``; the id is None when the user already holds ``limit``."""
        slot = uuid.uuid4().hex
        now = time.time()
        try:
            ok, used = self._acquire(
                keys=[Keys.user_live(user)],
                args=[now, now + self.LEASE_S, self.limit, slot, int(self.LEASE_S * 2)],
            )
        except redis.RedisError as exc:
            log.warning("live connection limit not checked (Redis: %s)", type(exc).__name__)
            return slot, 0
        return (slot if ok else None), int(used)

    def refresh(self, user: str, slot: str) -> None:
        try:
            self.client.zadd(Keys.user_live(user), {slot: time.time() + self.LEASE_S}, xx=True)
        except redis.RedisError as exc:
            log.warning("live slot not refreshed (Redis: %s)", type(exc).__name__)

    def release(self, user: str, slot: str) -> None:
        try:
            self.client.zrem(Keys.user_live(user), slot)
        except redis.RedisError as exc:
            log.warning("live slot not released (Redis: %s)", type(exc).__name__)
