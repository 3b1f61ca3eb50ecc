"""The recorder's Redis consumer group (``recorder``) on each job's stream.

A previous owner's unacknowledged entries are claimed first (XAUTOCLAIM), then
this consumer's own pending ones are re-read, then new ones (``>``). A group lost
with Redis's data (NOGROUP) is re-created from id 0.

Entries come as hiredis parses them, ``(entry_id, [field, value, field, value, ...])``
(``None`` for an entry trimmed while pending): redis-py's own reply parsing, a dict per
entry, was a quarter of the recorder's time (:mod:`amptrain.server.recorder.entries` reads
the pairs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from amptrain.contract.stream import text

GROUP = "recorder"


def is_nogroup(exc: redis.ResponseError) -> bool:
    return "NOGROUP" in str(exc)


def _streams(response: Any, **_options: Any) -> list[tuple[Any, list[Any]]]:
    """An XREADGROUP reply (RESP3: a map; RESP2: a list of pairs) as (key, entries)."""
    if not response:
        return []
    pairs = response.items() if isinstance(response, dict) else response
    return [(key, entries) for key, entries in pairs]


class ConsumerGroup:
    def __init__(self, client: redis.Redis, consumer: str, batch: int) -> None:
        self.redis = client
        # The same connections; its own reply parsing for XREADGROUP only.
        self._reads = redis.Redis(connection_pool=client.connection_pool)
        self._reads.set_response_callback("XREADGROUP", _streams)
        self.consumer = consumer
        self.batch = batch
        self._created: set[str] = set()

    def read_new(
        self, keys: Iterable[str], block_ms: int | None, count: int
    ) -> list[tuple[str, list[Any]]]:
        """New entries of every stream in ``keys`` (up to ``count`` each), as (key, entries)."""
        streams = {k: ">" for k in keys}
        if not streams:
            return []
        reply: Any = self._reads.xreadgroup(
            GROUP,
            self.consumer,
            streams,  # type: ignore[arg-type]
            count=count,
            block=block_ms,
        )
        return [(text(key), entries) for key, entries in reply]

    def take_over(self, key: str) -> None:
        """Make the entries a previous owner left unacknowledged this consumer's pending ones."""
        try:
            self._claim_pending(key)
        except redis.ResponseError as exc:
            if not is_nogroup(exc):
                raise
            self._created.discard(key)
            self._claim_pending(key)

    def pending_after(self, key: str, last: str) -> list[Any]:
        """This consumer's delivered but unacknowledged entries after ``last`` (one page)."""
        reply: Any = self._reads.xreadgroup(GROUP, self.consumer, {key: last}, count=self.batch)
        return reply[0][1] if reply else []

    def ack(self, acks: dict[str, list[Any]], marks: dict[str, str], ttl_s: int) -> None:
        """Acknowledge the entry ids per stream key and set each ``marks`` key to its entry
        id (expiring after ``ttl_s``), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for key, ids in acks.items():
            pipe.xack(key, GROUP, *ids)
        for key, entry_id in marks.items():
            pipe.set(key, entry_id, ex=ttl_s)
        pipe.execute()

    def forget(self) -> None:
        """Redis may have lost the groups: check (and re-create) each again."""
        self._created.clear()

    def _claim_pending(self, key: str) -> None:
        self._ensure(key)
        start = "0-0"
        while True:  # XAUTOCLAIM walks the group's pending list; "0-0" means the end
            reply = self.redis.xautoclaim(key, GROUP, self.consumer, 0, start, count=self.batch)
            start = text(reply[0])
            if start == "0-0":
                return

    def _ensure(self, key: str) -> None:
        if key in self._created:
            return
        try:
            self.redis.xgroup_create(key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._created.add(key)
