"""Per-user limits shared by every API process through Redis.

* The write rate: the ``limits`` library's moving window (exact, one short list per
  user) over the windows in ``AMPTRAIN_WRITE_RATE_LIMIT``; failed authentications per
  client address the same way (``AMPTRAIN_AUTH_FAILURE_RATE_LIMIT``).
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
import threading
import time
import uuid
from dataclasses import dataclass

import redis
from limits import RateLimitItem, parse_many
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

from amptrain.core.logs import shown
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


class RateLimiter:
    """``hit(who)`` for each counted request; a :class:`Refused` when ``who`` is over a
    window. ``setting`` names the variable ``spec`` came from (for its error), ``prefix``
    keeps each limit's windows apart in Redis."""

    def __init__(
        self,
        spec: str,
        client: redis.Redis,
        setting: str = "AMPTRAIN_WRITE_RATE_LIMIT",
        prefix: str = Keys.RATE_LIMITS,
    ) -> None:
        try:
            self.items: list[RateLimitItem] = parse_many(spec)
        except ValueError:
            raise ValueError(
                f"{setting}={spec[:60]!r} is not like '120/minute' or '10/second;1000/hour'"
            ) from None
        storage = RedisStorage(
            "redis://", connection_pool=client.connection_pool, key_prefix=prefix
        )
        self.limiter = MovingWindowRateLimiter(storage)

    def hit(self, who: str, cost: int = 1) -> Refused | None:
        """Count ``cost`` requests (a comparison of N precisions is N jobs)."""
        key = _user_key(who)
        try:
            for item in self.items:
                if not self.limiter.hit(item, key, cost=cost):
                    reset = self.limiter.get_window_stats(item, key).reset_time
                    return Refused(str(item), max(1, math.ceil(reset - time.time())))
        except redis.RedisError as exc:
            log.warning("rate limit not checked (Redis: %s)", type(exc).__name__)
        return None


class AuthFailures:
    """Failed authentications per client address: each is logged and counted (across API
    processes, through Redis); past ``spec`` the address's failures are answered 429, in
    every process that sees it fail once more, until its window allows again. Only
    failures: the caller checks the token first and a valid one always passes, so a stale
    token on a shared address (every client of ``amptrain up`` is 127.0.0.1) locks no one
    out. Tokens are far too long to guess, so this is about load and visibility: 500
    unknown tokens a second were all answered 401 without a word in the log."""

    MAX_BLOCKED = 10_000
    """Addresses one process remembers as blocked (the oldest are forgotten first)."""

    def __init__(self, spec: str, client: redis.Redis) -> None:
        self.limiter = RateLimiter(
            spec, client, "AMPTRAIN_AUTH_FAILURE_RATE_LIMIT", Keys.AUTH_FAILURES
        )
        self.limit = ";".join(str(item) for item in self.limiter.items)
        self._blocked: dict[str, float] = {}  # address -> monotonic time it is free again
        self._lock = threading.Lock()

    def blocked_for(self, address: str) -> int | None:
        """Seconds ``address``'s failures are still refused for, or None."""
        with self._lock:
            until = self._blocked.get(address)
            if until is None:
                return None
            left = until - time.monotonic()
            if left <= 0:
                del self._blocked[address]
                return None
            return max(1, math.ceil(left))

    def failed(self, address: str, reason: str) -> Refused | None:
        """Count a failure of ``address``; a :class:`Refused` once it is over the limit."""
        refused = self.limiter.hit(address)
        if refused is None:
            log.warning("authentication failed from %s: %s", shown(address), reason)
            return None
        with self._lock:
            if address not in self._blocked:
                log.warning(
                    "authentication failures from %s passed %s: refusing it for %ds",
                    shown(address),
                    refused.limit,
                    refused.retry_after_s,
                )
            while len(self._blocked) >= self.MAX_BLOCKED:
                del self._blocked[next(iter(self._blocked))]
            self._blocked[address] = time.monotonic() + refused.retry_after_s
        return refused


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
