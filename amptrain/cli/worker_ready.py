"""When ``amptrain up`` may say it is up: once a live worker takes its first queue's jobs
(worker presence in Redis), so that a job submitted on that line is routed knowing the
machine (a CPU-only one's ``device: auto`` jobs go to ``cpu``) and starts at once."""

from __future__ import annotations

import redis

from amptrain.core import presence
from amptrain.core.redis import client


class WorkerReady:
    """Answers, between ``up``'s looks at its parts, whether the worker has just come up."""

    def __init__(self, redis_url: str, queue: str) -> None:
        self.queue = queue
        self.redis = client(redis_url, timeout=1.0)
        self.said = False

    def first_time(self) -> bool:
        """True once: the first time a live worker serves the queue."""
        if self.said:
            return False
        try:
            live = self.queue in presence.served_queues(self.redis)
        except redis.RedisError:
            return False  # Redis is starting too: the next look
        self.said = live
        return live

    def close(self) -> None:
        self.redis.close()
