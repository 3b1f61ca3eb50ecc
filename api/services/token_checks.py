"""Open WebSocket/SSE streams re-check their token: revoked or expired since they opened?

One answer per token per ``recheck_s`` for the whole process (a user's many streams share
it), so a stream checks at its next message without a query per message.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from api.store import tokens


class TokenChecks:
    def __init__(self, sessions: sessionmaker[Session], recheck_s: float) -> None:
        self.sessions = sessions
        self.recheck_s = recheck_s
        self._answers: dict[str, tuple[bool, float]] = {}
        self._lock = threading.Lock()

    def cached(self, digest: str) -> bool | None:
        """The answer if one younger than ``recheck_s`` is known (no I/O: safe on the loop)."""
        with self._lock:
            answer = self._answers.get(digest)
        if answer is None or time.monotonic() - answer[1] > self.recheck_s:
            return None
        return answer[0]

    def check(self, digest: str) -> bool:
        """Ask the database (blocking: run it in a thread) and remember the answer."""
        with self.sessions() as s:
            active = tokens.verify_digest(s, digest) is not None
        with self._lock:
            if len(self._answers) > 10_000:  # tokens come and go; never grow without bound
                self._answers.clear()
            self._answers[digest] = (active, time.monotonic())
        return active
