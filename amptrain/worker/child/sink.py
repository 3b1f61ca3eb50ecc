"""The training child's telemetry sink: batches of records into the job's Redis Stream.

The buffering, retrying and re-sending after Redis data loss are
:class:`amptrain.core.stream_writer.StreamWriter`'s (the supervisor's lifecycle
events use the same writer); this adds building the client from the launch's URL
and closing it. In a training child it runs in the sink process
(:mod:`amptrain.worker.child.sink_process`), out of the training process's GIL.
"""

from __future__ import annotations

import redis

from amptrain.core.stream_writer import StreamWriter


class RedisSink(StreamWriter):
    @classmethod
    def from_url(cls, url: str, job_id: str, attempt: int) -> RedisSink:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        return cls(client, job_id, attempt)

    def close(self, timeout: float = 30.0) -> None:
        """Keep trying to deliver what is buffered, up to ``timeout`` seconds; then disconnect."""
        super().close(timeout)
        self.client.close()
