"""A buffered, retrying writer of one attempt's entries into its job's stream.

Nothing is lost to a Redis outage:

* entries that could not be sent stay buffered and go out, in order, once Redis
  answers again;
* entries that were sent are *retained* until the recorder says they are in SQL
  (it sets :meth:`~amptrain.core.redis.Keys.recorded` to the newest entry id it
  committed). After an outage the writer checks which retained entries the stream
  still holds and re-sends the rest: a Redis that restarted without its data (or
  lost the last second of its AOF) gets them again. The recorder ignores duplicates.

The supervisor's lifecycle events (``amptrain.worker.pool.events``) use it, and so does the
training child's telemetry sink (``amptrain.worker.child.sink.RedisSink``: this class plus
``from_url`` and a ``close`` that also closes its client).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import redis

from amptrain.contract.cursor import Cursor
from amptrain.contract.stream import STREAM_MAXLEN, Fields, encode
from amptrain.core.redis import Keys

log = logging.getLogger(__name__)

RETRY_EVERY_S = 0.5
MAX_BUFFERED = 1_000_000  # entries held in memory at most; beyond that the oldest go (counted)


class StreamWriter:
    """``write(items)`` appends (or buffers); ``flush()`` retries; ``close()`` delivers."""

    def __init__(self, client: redis.Redis, job_id: str, attempt: int) -> None:
        self.client = client
        self.job_id = job_id
        self.attempt = attempt
        self.key = Keys.telemetry(job_id)
        self.unsent: deque[Fields] = deque()
        self.retained: deque[tuple[Cursor, Fields]] = deque()
        self.sent = 0
        self.lost = 0
        self._failed_at = 0.0
        self._recovering = False

    def write(self, items: list[dict[str, Any]]) -> None:
        self.unsent.extend(encode(i, job_id=self.job_id, attempt=self.attempt) for i in items)
        self._bound()
        if time.monotonic() - self._failed_at >= RETRY_EVERY_S:
            self.flush()

    def flush(self) -> bool:
        """Send everything buffered; False (and keep it) if Redis is unreachable."""
        try:
            # A Redis that restarted between two flushes raises nothing (the client just
            # reconnects): the newest entry we sent having vanished is how we notice.
            if self.retained and (self._recovering or not self._holds(self.retained[-1][0])):
                self._resend_lost()
            self._recovering = False
            if self.unsent:
                self._send()
            else:
                self._trim(self.client.get(Keys.recorded(self.job_id)))
        except redis.RedisError as exc:
            if not self._failed_at:
                log.warning(
                    "job %s: stream entries buffered, Redis unreachable (%s)", self.job_id, exc
                )
            self._failed_at = time.monotonic()
            self._recovering = True
            return False
        self._failed_at = 0.0
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Keep trying to deliver what is buffered, up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.flush() and time.monotonic() < deadline:
            time.sleep(RETRY_EVERY_S)
        if self.unsent:
            log.error("job %s: %d stream entries undelivered", self.job_id, len(self.unsent))

    def _send(self) -> None:
        batch = list(self.unsent)
        pipe = self.client.pipeline(transaction=False)
        for fields in batch:
            pipe.xadd(self.key, fields, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
        pipe.get(Keys.recorded(self.job_id))
        *ids, recorded = pipe.execute()
        for _ in batch:
            self.unsent.popleft()
        self.retained.extend(zip((Cursor.of_entry(i) for i in ids), batch, strict=True))
        self.sent += len(batch)
        self._trim(recorded)

    def _trim(self, recorded: bytes | str | None) -> None:
        if recorded is None:
            return
        mark = Cursor.of_entry(recorded)
        while self.retained and self.retained[0][0] <= mark:
            self.retained.popleft()

    def _holds(self, entry: Cursor) -> bool:
        return bool(self.client.xrange(self.key, min=str(entry), max=str(entry), count=1))

    def _resend_lost(self) -> None:
        """Queue again (in order, ahead of newer entries) what the stream no longer holds."""
        entries: Any = self.client.xrange(self.key, min=str(self.retained[0][0]))
        present = {Cursor.of_entry(i) for i, _ in entries}
        lost = [fields for i, fields in self.retained if i not in present]
        self.retained = deque((i, f) for i, f in self.retained if i in present)
        if lost:
            log.warning("job %s: Redis lost %d stream entries; re-sending", self.job_id, len(lost))
        self.unsent.extendleft(reversed(lost))

    def _bound(self) -> None:
        while len(self.unsent) + len(self.retained) > MAX_BUFFERED:
            (self.retained or self.unsent).popleft()
            self.lost += 1
