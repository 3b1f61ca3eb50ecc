"""The webhook sender: a loop in each API process (like the dispatcher) that sends the
deliveries the recorder stored.

Each round it claims at most as many due rows as it has free sending slots (a guarded
UPDATE with a token and a lease: of several API replicas, one sends a given delivery)
and hands them to a bounded thread pool, so a receiver that hangs, is slow or answers
500s holds one slot for at most the request's timeouts, and never the loop. Each
outcome is recorded fenced by the claim; a failed attempt is retried with exponential
backoff up to the rule's ``max_retries``. Rows live in SQL: an API restart loses none
(a row claimed by a process that died is taken again once its lease ran out).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core.settings import Settings
from amptrain.server import observability, webhooks
from amptrain.store import deliveries
from amptrain.store.deliveries import Due

log = logging.getLogger(__name__)


class DeliverySender:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self.policy = webhooks.Policy(
            settings.webhook_allowed_hosts,
            settings.webhook_allow_private,
            settings.webhook_timeout_seconds,
        )
        self.slots = settings.webhook_concurrency
        # Longer than one request can take (connect + write + read timeouts, and a pool
        # wait): a live sender's claim never runs out under it.
        self.lease_s = 4 * settings.webhook_timeout_seconds + 10
        self._free = threading.Semaphore(self.slots)
        self._wake = threading.Event()

    def run(self, stop: threading.Event) -> None:
        client = webhooks.make_client(self.policy)
        pool = ThreadPoolExecutor(self.slots, thread_name_prefix="amptrain-webhook")
        try:
            while not stop.is_set():
                try:
                    self.round(pool, client)
                except Exception:
                    log.exception("webhook sender round failed; retrying")
                self._wake.wait(self.settings.webhook_poll_seconds)
                self._wake.clear()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            client.close()

    def wake(self) -> None:
        self._wake.set()

    def round(self, pool: ThreadPoolExecutor, client: httpx.Client) -> int:
        """Claim what free slots can send now and start sending it; the number claimed."""
        free = 0
        while self._free.acquire(blocking=False):
            free += 1
        if not free:
            return 0
        try:
            with self.sessions.begin() as s:
                due = deliveries.claim(s, free, self.lease_s)
        except Exception:
            self._release(free)
            raise
        self._release(free - len(due))
        for item in due:
            pool.submit(self._send, client, item)
        return len(due)

    def _release(self, n: int) -> None:
        for _ in range(n):
            self._free.release()

    def _send(self, client: httpx.Client, due: Due) -> None:
        try:
            outcome = webhooks.send(client, due, self.policy)
            retry_in = self.backoff(due.attempts)
            if not outcome.delivered and not outcome.retry:
                retry_in = 0.0
            with self.sessions.begin() as s:
                recorded = deliveries.record_attempt(
                    s,
                    due,
                    outcome.record(),
                    outcome.delivered,
                    retry_in,
                    give_up=not outcome.delivered and not outcome.retry,
                )
            if not recorded:
                log.warning("delivery %d: claim lost before its outcome was recorded", due.id)
            observability.webhook_attempt(_outcome(outcome, due))
        except Exception:
            log.exception("delivery %d: sending failed", due.id)
        finally:
            self._free.release()
            self._wake.set()  # a slot is free: look for more at once

    def backoff(self, attempts_before: int) -> float:
        """Seconds before retry number ``attempts_before + 1``: doubling, capped."""
        base = self.settings.webhook_backoff_seconds
        return float(
            min(base * 2 ** min(attempts_before, 30), self.settings.webhook_backoff_max_seconds)
        )


def _outcome(outcome: webhooks.Outcome, due: Due) -> str:
    """The ``amptrain_webhook_attempts`` label of one attempt."""
    if outcome.delivered:
        return "delivered"
    if outcome.status_code is None and not outcome.retry:
        return "refused"  # the destination is not allowed (nothing was sent)
    return "retry" if outcome.retry and due.attempts < due.max_retries else "failed"
