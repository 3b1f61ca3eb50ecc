"""One open WebSocket or SSE watcher: its slot under the per-user limit, its token
re-checked before each message, and one log line when it closes, saying why.

Close codes it adds to :mod:`amptrain.server.web.routes.live`'s: 4401 when the token was revoked or
expired while the stream was open, 4429 when the user already has
``AMPTRAIN_MAX_LIVE_CONNECTIONS_PER_USER`` watchers open.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import anyio

from amptrain.core.logs import shown
from amptrain.server.runtime import Services
from amptrain.server.web.auth import Principal
from amptrain.store.models import utcnow

log = logging.getLogger(__name__)

CLOSE_TOKEN = 4401
CLOSE_TOO_MANY = 4429


@dataclass
class LiveSession:
    services: Services
    principal: Principal
    job_id: str
    kind: str
    """``WebSocket`` or ``SSE`` (for the log)."""
    slot: str | None = None
    sent: int = 0
    started: float = field(default_factory=time.monotonic)
    _refreshed: float = field(default_factory=time.monotonic)

    def acquire(self) -> str | None:
        """Take a slot (blocking: Redis); the reason it was refused, or None. Admin tokens
        (operators, dashboards on a wall, benchmarks) are not limited."""
        if self.principal.is_admin:
            return None
        slots = self.services.live_slots
        self.slot, used = slots.acquire(self.principal.name)
        if self.slot is None:
            return (
                f"too many live connections: {self.principal.name!r} has {used} open, "
                f"at most {slots.limit}"
            )
        return None

    def cleared(self) -> bool:
        """The next message may go without asking anything (the common case, no I/O and
        no coroutine: it runs once per watcher per delivery round)."""
        principal = self.principal
        if principal.expires_at is not None and utcnow() >= principal.expires_at:
            return False
        if not self.services.token_checks.fresh(principal.token_hash):
            return False
        if self.slot and time.monotonic() - self._refreshed > self.services.live_slots.REFRESH_S:
            return False
        self.sent += 1
        return True

    async def before_message(self) -> str | None:
        """Why this message must not be sent (token revoked or expired), or None. Keeps
        the slot's lease fresh while messages flow (heartbeats included)."""
        if self.cleared():
            return None
        principal = self.principal
        if principal.expires_at is not None and utcnow() >= principal.expires_at:
            return "token expired"
        checks = self.services.token_checks
        active = checks.cached(principal.token_hash)
        if active is None:
            active = await anyio.to_thread.run_sync(checks.check, principal.token_hash)
        if not active:
            expired = principal.expires_at is not None and utcnow() >= principal.expires_at
            return "token expired" if expired else "token revoked"
        if self.slot and time.monotonic() - self._refreshed > self.services.live_slots.REFRESH_S:
            self._refreshed = time.monotonic()
            await anyio.to_thread.run_sync(
                self.services.live_slots.refresh, principal.name, self.slot
            )
        self.sent += 1
        return None

    async def finish(self, code: int | None, reason: str) -> None:
        """Give the slot back and log why the watcher closed."""
        if self.slot is not None:
            slot, self.slot = self.slot, None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(
                    self.services.live_slots.release, self.principal.name, slot
                )
        closed(self.kind, self.job_id, self.principal.name, code, reason, self.sent, self.started)


def closed(
    kind: str,
    job_id: str,
    user: str | None,
    code: int | None,
    reason: str,
    sent: int = 0,
    started: float | None = None,
) -> None:
    seconds = time.monotonic() - started if started is not None else 0.0
    log.info(
        "live %s watcher closed: %s (code %s, %d messages, %.1fs)",
        kind,
        reason,
        code if code is not None else "none",
        sent,
        seconds,
        # A refused handshake's job id is whatever the client put in the path (decoded).
        extra={"job_id": shown(job_id), "user": user, "close_code": code, "close_reason": reason},
    )
