"""Everything the API knows about Celery and kombu's Redis transport, in one place.

The API sends ``amptrain.run_job`` by name through a send-only Celery app
(:func:`make_celery`) and never imports the worker. To measure queues and to
find lost messages it also reads kombu's Redis layout directly:

- a queue ``q`` is one Redis list per priority step: ``q`` itself for priority
  0 and ``q\\x06\\x16{step}`` for the others (kombu's ``Channel.sep`` and
  ``Channel.priority_steps``, read from kombu itself below);
- each list item is a JSON message whose ``body`` (base64 when
  ``properties.body_encoding`` says so) is Celery's protocol 2 payload
  ``[args, kwargs, embed]``: the job id is ``args[0]`` of a ``amptrain.run_job``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery
from kombu.transport.redis import Channel

from amptrain.core.enums import TaskName
from amptrain.core.settings import Settings

PRIORITY_SEP: str = Channel.sep
PRIORITY_STEPS: tuple[int, ...] = tuple(Channel.priority_steps)


def make_celery(settings: Settings) -> Celery:
    """A send-only Celery app: JSON only, no results, and short broker timeouts."""
    timeout = settings.broker_timeout_seconds
    app = Celery("amptrain-api", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        # Fail fast and let the sweep retry: a request thread never waits on the broker,
        # but the sending thread should not sit in kombu's retry loop either.
        broker_connection_timeout=timeout,
        broker_connection_retry=False,
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=0,
        broker_transport_options={
            "socket_connect_timeout": timeout,
            "socket_timeout": timeout,
            "retry_on_timeout": False,
        },
        task_publish_retry=True,
        task_publish_retry_policy={
            "max_retries": 1,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.2,
        },
        broker_pool_limit=4,
        task_send_sent_event=False,
    )
    return app


def queue_lists(queue: str) -> list[str]:
    """The Redis lists kombu keeps for ``queue``, one per priority step."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def queue_depths(client: redis.Redis, queues: Iterable[str]) -> dict[str, int]:
    """Messages waiting in each queue (sent, not yet taken by a worker)."""
    names = list(queues)
    pipe = client.pipeline(transaction=False)
    for queue in names:
        for key in queue_lists(queue):
            pipe.llen(key)
    lengths = pipe.execute()
    per = len(PRIORITY_STEPS)
    return {q: sum(lengths[i * per : (i + 1) * per]) for i, q in enumerate(names)}


def waiting_job_ids(client: redis.Redis, queue: str) -> set[str]:
    """Ids of the jobs whose ``run_job`` message still waits in ``queue``."""
    pipe = client.pipeline(transaction=False)
    for key in queue_lists(queue):
        pipe.lrange(key, 0, -1)
    found = set()
    for items in pipe.execute():
        for raw in items:
            job_id = job_id_of(raw)
            if job_id is not None:
                found.add(job_id)
    return found


def job_id_of(raw: bytes | str) -> str | None:
    """The job id a queued message carries, or None if it is not a ``run_job`` message."""
    try:
        message: dict[str, Any] = json.loads(raw)
        if message.get("headers", {}).get("task") != TaskName.RUN_JOB:
            return None
        body: Any = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return args[0] if args and isinstance(args[0], str) else None
