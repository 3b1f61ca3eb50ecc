"""Open WebSocket/SSE streams re-check their token: revoked or expired since they opened?

One answer per token per ``recheck_s`` for the whole process (a user's many streams share
it), so a stream checks at its next message without a query per message. When the answer
is due, ONE stream asks the database while the token's other streams keep the last answer
until it comes: 500 streams of one token must not send 500 queries through the thread
pool at the same instant every ``recheck_s`` (that stalled every watcher's messages).
"""

from __future__ import annotations

import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from amptrain.store import tokens


class TokenChecks:
    def __init__(self, sessions: sessionmaker[Session], recheck_s: float) -> None:
        self.sessions = sessions
        self.recheck_s = recheck_s
        self._answers: dict[str, tuple[bool, float]] = {}
        self._asking: set[str] = set()  # digests one stream is asking the database about
        self._lock = threading.Lock()

    def cached(self, digest: str) -> bool | None:
        """The answer to use now, or None: then the caller must :meth:`check` (no I/O:
        safe on the loop). A due answer is still given while another stream asks."""
        with self._lock:
            answer = self._answers.get(digest)
            if answer is None:
                return None
            if time.monotonic() - answer[1] <= self.recheck_s or digest in self._asking:
                return answer[0]
            self._asking.add(digest)  # this caller asks; the others keep the last answer
            return None

    def fresh(self, digest: str) -> bool:
        """The token was found active within ``recheck_s`` (a lock-free read: a stale
        answer only sends the caller to :meth:`cached`)."""
        answer = self._answers.get(digest)
        return answer is not None and answer[0] and time.monotonic() - answer[1] <= self.recheck_s

    def check(self, digest: str) -> bool:
        """Ask the database (blocking: run it in a thread) and remember the answer."""
        try:
            with self.sessions() as s:
                active = tokens.verify_digest(s, digest) is not None
        finally:
            with self._lock:
                self._asking.discard(digest)
        with self._lock:
            if len(self._answers) > 10_000:  # tokens come and go; never grow without bound
                self._answers.clear()
            self._answers[digest] = (active, time.monotonic())
        return active
