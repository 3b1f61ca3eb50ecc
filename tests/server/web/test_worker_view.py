"""Where jobs run (a worker's name ``amptrain-PID@HOST``, its host name, its processes'
pids) is an admin's detail: ``GET /workers`` and ``GET /jobs/{id}`` hide it from everyone
else, as ``GET /jobs/{id}/events`` does (tests/server/web/test_event_view.py). The job is
claimed in SQL as a supervisor claims it, on each database; the worker announces itself
in Redis through the worker's own presence calls."""

from __future__ import annotations

import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core import presence
from amptrain.store import jobs
from amptrain.store.db import make_engine, make_session_factory
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack, user_client

WORKER = "amptrain-4242@gpu-node-17"


def test_only_admins_see_where_jobs_run(
    api_stack: Stack, database_url: str, redis_server: EmbeddedRedis
) -> None:
    with user_client(api_stack, "alice") as alice:
        job = alice.post("/jobs", json=cpu_job()).json()["id"]
        engine = make_engine(database_url)
        with make_session_factory(engine).begin() as s:
            assert jobs.claim(s, job, WORKER, 600) == 1
        engine.dispose()
        client = redis.Redis.from_url(redis_server.url)
        info = {"queues": ["cpu"], "concurrency": 1, "hostname": "gpu-node-17", "pid": 4242}
        presence.publish_worker(client, WORKER, info, 60)
        slot = {"job_id": job, "attempt": 1, "gpu": None, "gpus": [], "pid": 5151, "step": 3}
        presence.publish_slot(client, WORKER, 0, slot, 60)
        client.close()

        assert alice.get(f"/jobs/{job}").json()["worker"] is None
        assert [j["worker"] for j in alice.get("/jobs").json()["items"]] == [None]
        (seen,) = alice.get("/workers").json()["items"]
        assert "name" not in seen and "hostname" not in seen and "pid" not in seen
        assert seen["queues"] == ["cpu"] and seen["concurrency"] == 1
        # The job by its name too (the dashboard shows names, not ids).
        name = alice.get(f"/jobs/{job}").json()["name"]
        assert seen["current_jobs"] == [
            {
                "slot": 0,
                "job_id": job,
                "name": name,
                "attempt": 1,
                "gpu": None,
                "gpus": [],
                "step": 3,
            }
        ]
        assert "gpu-node-17" not in alice.get("/workers").text

    admin = api_stack.client
    assert admin.get(f"/jobs/{job}").json()["worker"] == WORKER
    (full,) = admin.get("/workers").json()["items"]
    assert full["name"] == WORKER and full["hostname"] == "gpu-node-17" and full["pid"] == 4242
    assert full["current_jobs"][0]["pid"] == 5151
