"""The command-line client against a real server: ``amptrain submit --watch`` with a real
Celery worker, the other commands, transparent resume across an API restart, and where
the URL and token come from."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.client.http import ApiError, Client, ClientConfig, resolve_config
from amptrain.contract.local_server import write_record
from tests.support.producer import Producer
from tests.support.specs import service_job
from tests.support.stack import Stack, free_port, wait_until
from tests.support.terminal import at_terminal

pytestmark = pytest.mark.slow


def amptrain(stack: Stack, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {
        **stack.env,
        "AMPTRAIN_URL": f"http://127.0.0.1:{stack.port}",
        "AMPTRAIN_TOKEN": stack.token,
    }
    return subprocess.run(
        [sys.executable, "-m", "amptrain.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_submit_watch_exits_zero_and_the_other_commands_work(
    api_stack: Stack, tmp_path: Path
) -> None:
    api_stack.start_worker()
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(service_job(max_steps=20)))
    done = amptrain(api_stack, "submit", str(spec), "--watch")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[0]
    assert "succeeded" in done.stderr
    assert api_stack.job(job_id)["status"] == "succeeded"

    listed = amptrain(api_stack, "jobs")
    assert listed.returncode == 0 and job_id in listed.stdout  # piped: whole ids
    logs = amptrain(api_stack, "logs", job_id)
    assert logs.returncode == 0
    assert [w for w in ("queued", "started", "succeeded") if w in logs.stdout] == [
        "queued",
        "started",
        "succeeded",
    ]
    # One short line per event: no JSON, no server paths.
    assert "{" not in logs.stdout and "/" not in logs.stdout, logs.stdout
    again = amptrain(api_stack, "watch", job_id, "--json", "--from-start")
    assert again.returncode == 0
    assert again.stdout.count('"type": "metric"') == 20
    # By default a watch starts at the newest point: of a finished job, only its end.
    now = amptrain(api_stack, "watch", job_id, "--json")
    assert now.returncode == 0 and '"type": "metric"' not in now.stdout
    assert '"type": "end"' in now.stdout
    # At a terminal, a watch of the finished job tells what already happened (each event
    # once) and the job's own elapsed time, not the watch's.
    env = {**api_stack.env, "AMPTRAIN_URL": f"http://127.0.0.1:{api_stack.port}"}
    env["AMPTRAIN_TOKEN"] = api_stack.token
    cmd = [sys.executable, "-m", "amptrain.cli.main", "watch", job_id]
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", at_terminal(cmd, env, columns=80))
    assert all(len(line) <= 80 for line in screen.splitlines()), screen
    for kind in ("queued on queue", "started attempt 1", "succeeded"):
        assert len(re.findall(rf"\d\d:\d\d:\d\d {kind}", screen)) == 1, (kind, screen)
    job = api_stack.job(job_id)
    ran = datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])
    assert f" {timedelta(seconds=int(ran.total_seconds()))} " in screen, (ran, screen)
    finished = amptrain(api_stack, "cancel", job_id)
    assert finished.returncode == 2 and "already succeeded" in finished.stderr


def test_ids_are_whole_when_piped_and_any_unique_prefix_names_a_job(api_stack: Stack) -> None:
    # Submit until two ids share their first digit and another id does not (ids are random:
    # the first two share it one time in sixteen, and then a third is needed).
    ids: list[str] = []

    def shared_and_other() -> str | None:
        firsts = [i[:3] for i in ids]
        twice = [f for f in firsts if firsts.count(f) > 1]
        return twice[0] if twice and len(set(firsts)) > 1 else None

    while (shared := shared_and_other()) is None:
        ids.append(api_stack.submit(service_job(max_steps=5))["id"])
    listed = json.loads(amptrain(api_stack, "jobs", "--json").stdout)
    assert {j["id"] for j in listed} == set(ids)
    plain = amptrain(api_stack, "jobs").stdout
    assert all(i in plain for i in ids), plain

    one = next(i for i in ids if not i.startswith(shared))
    unique = next(one[:n] for n in range(3, 35) if sum(i.startswith(one[:n]) for i in ids) == 1)
    logs = amptrain(api_stack, "logs", unique)
    assert logs.returncode == 0 and "queued" in logs.stdout, logs.stderr
    several = amptrain(api_stack, "cancel", shared)
    assert several.returncode == 2 and "starts several job ids" in several.stderr
    assert all(api_stack.job(i)["status"] == "queued" for i in ids)  # nothing was cancelled
    assert amptrain(api_stack, "cancel", unique).returncode == 0
    assert api_stack.job(one)["status"] == "cancelled"
    for wrong in ("j_0000000", "job-1"):
        missing = amptrain(api_stack, "logs", wrong)
        assert missing.returncode == 2 and "not_found" in missing.stderr, missing.stderr


def test_watch_of_a_failing_spec_or_job_exits_non_zero(api_stack: Stack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "model": {"name": "nope"}, "max_steps": 0}')
    refused = amptrain(api_stack, "submit", str(bad))
    assert refused.returncode == 2 and "max_steps" in refused.stderr
    queued = api_stack.submit(service_job(max_steps=5))
    assert api_stack.client.post(f"/jobs/{queued['id']}/cancel").status_code == 202
    watched = amptrain(api_stack, "watch", queued["id"])
    assert watched.returncode == 1 and "cancelled" in watched.stderr
    unauthorized = amptrain(api_stack, "jobs", "--token", "wrong")
    assert unauthorized.returncode == 3


def test_watch_resumes_across_an_api_restart(
    api_stack: Stack, database_url: str, redis_server: EmbeddedRedis
) -> None:
    job = api_stack.submit(service_job(max_steps=100))
    producer = Producer(redis_server.url, database_url, job["id"])
    client = Client(ClientConfig(f"http://127.0.0.1:{api_stack.port}", api_stack.token))
    reconnects: list[str | None] = []

    async def follow() -> list[dict[str, Any]]:
        got = []
        async for msg in client.watch(job["id"], on_reconnect=lambda c, r: reconnects.append(c)):
            got.append(msg)
            if msg["type"] == "metric" and msg["data"]["step"] == 40:
                # The server dies under the watcher; more steps arrive while it is away.
                await asyncio.to_thread(api_stack.kill, "api", signal.SIGKILL)
                producer.steps(51, 80)
                producer.evals(80)
                await asyncio.to_thread(api_stack.start_api)
                producer.steps(81, 100)
                producer.finish(step=100)
        return got

    try:
        producer.start()
        producer.steps(1, 50)
        producer.evals(50)
        got = asyncio.run(follow())
    finally:
        producer.close()
        client.close()
    assert [m["data"]["step"] for m in got if m["type"] == "metric"] == list(range(1, 101))
    assert [m["data"]["step"] for m in got if m["type"] == "eval"] == [50, 80]
    assert got[-1]["type"] == "end" and got[-1]["data"]["status"] == "succeeded"
    assert reconnects and reconnects[0] is not None
    wait_until(lambda: api_stack.job(job["id"])["step"] == 100, 30, "all steps recorded")


def test_url_and_token_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AMPTRAIN_URL", "AMPTRAIN_TOKEN", "AMPTRAIN_CONFIG", "AMPTRAIN_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert resolve_config() == ClientConfig("http://127.0.0.1:8000", None)
    (tmp_path / ".amptrain").mkdir()
    (tmp_path / ".amptrain" / "admin-token").write_text("saved\n")
    assert resolve_config().token == "saved"
    config = tmp_path / "xdg" / "amptrain" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('url = "http://box:9000/"\ntoken = "from-file"\n')
    assert resolve_config() == ClientConfig("http://box:9000", "from-file")
    monkeypatch.setenv("AMPTRAIN_TOKEN", "from-env")
    assert resolve_config() == ClientConfig("http://box:9000", "from-env")
    assert resolve_config("http://flag:1", "flag") == ClientConfig("http://flag:1", "flag")


def test_the_client_finds_the_running_up_and_says_where_it_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`amptrain up --port N` records its URL in the data directory: `amptrain jobs` goes
    there (not to :8000) while that `up` lives; an unreachable server is named with where
    its URL came from."""
    for name in ("AMPTRAIN_URL", "AMPTRAIN_TOKEN", "AMPTRAIN_CONFIG", "AMPTRAIN_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    default = resolve_config()
    assert default.url == "http://127.0.0.1:8000" and "no running amptrain up" in default.source
    port = free_port()  # nothing listens there
    (tmp_path / ".amptrain").mkdir()
    write_record(tmp_path / ".amptrain", f"http://127.0.0.1:{port}", os.getpid())
    found = resolve_config()
    assert found.url == f"http://127.0.0.1:{port}" and found.source.startswith("from amptrain up")
    with pytest.raises(ApiError) as info:
        Client(found, timeout=5).jobs()
    assert info.value.code == "unreachable"
    assert f"http://127.0.0.1:{port} (from amptrain up, pid {os.getpid()})" in info.value.detail
    monkeypatch.setenv("AMPTRAIN_URL", "http://elsewhere:1")  # an explicit choice wins
    assert resolve_config().where == "http://elsewhere:1 (from AMPTRAIN_URL)"


def test_jobs_at_an_80_column_terminal_fit_and_show_a_prefix_to_type_back(
    api_stack: Stack,
) -> None:
    job = api_stack.submit(service_job(max_steps=5, name="a-job-with-a-long-name"))
    env = {**api_stack.env, "AMPTRAIN_URL": f"http://127.0.0.1:{api_stack.port}"}
    env["AMPTRAIN_TOKEN"] = api_stack.token
    shown = at_terminal([sys.executable, "-m", "amptrain.cli.main", "jobs"], env, columns=80)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in shown.splitlines() if line.strip()]
    assert all(len(line) <= 80 for line in lines), lines
    (row,) = [line for line in lines if job["id"][:12] in line]
    assert "queued" in row and "0/5" in row and re.search(r"\b\d+[smhd]\b", row), row
    prefix = row.split()[0].rstrip("…")
    assert len(prefix) >= 12 and job["id"].startswith(prefix)
    logs = amptrain(api_stack, "logs", prefix)  # what it shows can be typed back
    assert logs.returncode == 0 and "queued" in logs.stdout, logs.stderr
