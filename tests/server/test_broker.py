"""What the API reads of kombu's Redis layout, checked against messages Celery really sent."""

from __future__ import annotations

from pathlib import Path

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core import redis as core_redis
from amptrain.core.enums import TaskName
from amptrain.core.settings import Settings
from amptrain.server import broker


def test_depths_and_waiting_jobs_cover_every_priority_list(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, redis_url=redis_server.url, queues=["gpu", "cpu", "gpu-a100"]
    )
    app = broker.make_celery(settings)
    client = core_redis.client(redis_server.url)
    plain, urgent, other = "j_" + "a" * 32, "j_" + "b" * 32, "j_" + "c" * 32
    try:
        app.send_task(TaskName.RUN_JOB, args=[plain], queue="gpu-a100", ignore_result=True)
        # A priority above 0 lands in another Redis list of the same queue.
        app.send_task(
            TaskName.RUN_JOB, args=[urgent], queue="gpu-a100", ignore_result=True, priority=5
        )
        app.send_task(TaskName.RUN_JOB, args=[other], queue="cpu", ignore_result=True)
        app.send_task("some.other_task", args=["j_" + "d" * 32], queue="cpu", ignore_result=True)
        assert len(broker.queue_lists("gpu-a100")) > 1
        assert broker.queue_depths(client, settings.queues) == {"gpu": 0, "cpu": 2, "gpu-a100": 2}
        assert broker.waiting_job_ids(client, "gpu-a100") == {plain, urgent}
        assert broker.waiting_job_ids(client, "cpu") == {other}
        assert broker.waiting_job_ids(client, "gpu") == set()
        assert broker.job_id_of(b"not json") is None
    finally:
        app.close()
        client.close()
