"""The training child's telemetry sink: batches of records into the job's Redis Stream.

Runs on the engine's background publisher thread, so a slow or absent Redis
never stalls a training step. Records that could not be sent stay buffered
and go out, in order, once Redis answers again: a Redis blip delays
telemetry, it does not lose it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import redis

from api.state.stream import STREAM_MAXLEN, encode, telemetry_key

log = logging.getLogger(__name__)

RETRY_EVERY_S = 0.5
MAX_BUFFERED = 1_000_000  # ~200 MB of encoded records; beyond that the oldest go (counted)


class RedisSink:
    def __init__(self, client: redis.Redis, job_id: str, attempt: int) -> None:
        self.client = client
        self.job_id = job_id
        self.attempt = attempt
        self.key = telemetry_key(job_id)
        self.pending: deque[dict[str, str]] = deque()
        self.sent = 0
        self.lost = 0
        self._last_failure = 0.0

    @classmethod
    def from_url(cls, url: str, job_id: str, attempt: int) -> RedisSink:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        return cls(client, job_id, attempt)

    def write(self, items: list[dict[str, Any]]) -> None:
        self.pending.extend(encode(i, job_id=self.job_id, attempt=self.attempt) for i in items)
        while len(self.pending) > MAX_BUFFERED:
            self.pending.popleft()
            self.lost += 1
        if time.monotonic() - self._last_failure >= RETRY_EVERY_S:
            self.flush()

    def flush(self) -> bool:
        """Send everything buffered; False (and keep it) if Redis is unreachable."""
        if not self.pending:
            return True
        batch = list(self.pending)
        pipe = self.client.pipeline(transaction=False)
        for fields in batch:
            pipe.xadd(self.key, fields, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
        try:
            pipe.execute()
        except redis.RedisError as exc:
            if not self._last_failure:
                log.warning(
                    "telemetry for job %s buffered: Redis unreachable (%s)", self.job_id, exc
                )
            self._last_failure = time.monotonic()
            return False
        for _ in batch:
            self.pending.popleft()
        self.sent += len(batch)
        self._last_failure = 0.0
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Keep trying to deliver what is buffered, up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.flush() and time.monotonic() < deadline:
            time.sleep(RETRY_EVERY_S)
        if self.pending:
            log.error(
                "job %s: %d telemetry records undelivered at exit", self.job_id, len(self.pending)
            )
        self.client.close()
