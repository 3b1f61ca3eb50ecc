"""Request size and per-user limits against a real uvicorn: 413 before a long body is read,
short quotes of bad values, bounded listings, the active-jobs quota and the write rate
(shared by API processes through Redis); failed authentications: test_auth_failures.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.spec import JobSpec
from amptrain.store import jobs
from amptrain.store.db import make_engine, make_session_factory
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack, free_port, user_client, wait_until

MiB = 1024 * 1024
RATE = 30


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env.update(
        AMPTRAIN_MAX_ACTIVE_JOBS_PER_USER="3",
        AMPTRAIN_WRITE_RATE_LIMIT=f"{RATE}/minute",
        AMPTRAIN_MAX_PAGE_BYTES=str(64 * 1024),
    )
    stack.start_api()
    yield stack
    stack.close()


def raw_post(stack: Stack, head: str, chunks: Iterator[bytes]) -> bytes:
    """Send a request by hand (so the server can answer before the body is complete)
    and return the response's first bytes."""
    with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as sock:
        sock.sendall(head.encode())
        sent = 0
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what we test
        sock.settimeout(10)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return answer


def request_head(stack: Stack, length_header: str) -> str:
    return (
        f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {stack.token}\r\n"
        f"Content-Type: application/json\r\n{length_header}\r\n\r\n"
    )


def test_a_100_mb_body_is_refused_before_it_is_read(stack: Stack) -> None:
    # Declared length: answered at once; 64 KiB of the 100 MB are ever sent.
    head = request_head(stack, f"Content-Length: {100 * MiB}")
    started = time.monotonic()
    answer = raw_post(stack, head, iter([b'{"name": "' + b"A" * 65536]))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body == {"error": "too_large", "detail": f"request body larger than {MiB} bytes"}
    assert time.monotonic() - started < 5

    # Chunked, no declared length: cut off once the bytes counted pass the limit.
    def chunks() -> Iterator[bytes]:
        for _ in range(100 * 16):  # up to 100 MB in 64 KiB chunks, never finished
            yield b"10000\r\n" + b"B" * 65536 + b"\r\n"

    answer = raw_post(stack, request_head(stack, "Transfer-Encoding: chunked"), chunks())
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert stack.client.get("/jobs").json()["items"] == []
    assert stack.client.get("/healthz").status_code == 200


def test_errors_quote_only_a_short_prefix_of_a_bad_value(stack: Stack) -> None:
    c = stack.client
    huge = c.post("/jobs", json=cpu_job(name="N" * (20 * MiB)))
    assert huge.status_code == 413 and huge.json()["error"] == "too_large"
    for spec in (
        cpu_job(model={"name": "M" * 500_000}),
        cpu_job(dataset={"name": "synthetic-classification", "args": {"D" * 300_000: 1}}),
        cpu_job(name="N" * 500_000),
        cpu_job(precision="P" * 500_000),
    ):
        r = c.post("/jobs", json=spec)
        assert r.status_code == 422, r.text[:300]
        assert len(r.content) < 4000, r.text[:300]
        for letter in "MDNP":
            assert letter * 41 not in r.text
    # A name short enough for the spec but unknown: the message quotes its first 40.
    unknown = c.post("/jobs", json=cpu_job(model={"name": "M" * 90})).json()["detail"]
    assert unknown[0]["field"] == "model.name"
    assert f"'{'M' * 40}...' (90 characters)" in unknown[0]["message"], unknown
    assert "M" * 41 not in unknown[0]["message"]
    assert c.get("/jobs").json()["items"] == []


def test_job_listings_stay_small(stack: Stack) -> None:
    c = stack.client
    engine = make_engine(stack.env["AMPTRAIN_DATABASE_URL"])
    with make_session_factory(engine).begin() as s:  # 90 writes: more than the rate allows
        made = [
            jobs.create_job(s, JobSpec.model_validate(cpu_job(name=f"j{i:03d}")), "admin", "cpu")
            for i in range(90)
        ]
        ids = [job.id for job in made]
    engine.dispose()
    first = c.get("/jobs", params={"limit": 200})
    page = first.json()
    specs = sum(len(json.dumps(j["spec"], separators=(",", ":"))) for j in page["items"])
    assert 0 < len(page["items"]) < 90 and page["next_cursor"]
    assert specs <= 64 * 1024 + len(json.dumps(page["items"][-1]["spec"]))
    assert len(first.content) < 200 * 1024
    rest = c.get("/jobs", params={"limit": 200, "cursor": page["next_cursor"]}).json()
    assert [j["id"] for j in page["items"] + rest["items"]] == ids[::-1]


def test_active_jobs_per_user_are_limited(stack: Stack) -> None:
    with user_client(stack, "alice") as alice, user_client(stack, "bob") as bob:
        mine = [alice.post("/jobs", json=cpu_job()).json()["id"] for _ in range(3)]
        refused = alice.post("/jobs", json=cpu_job())
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["error"] == "too_many_requests"
        assert body["detail"]["limit"] == 3 and body["detail"]["in_use"] == 3
        assert "at most 3" in body["detail"]["message"]
        # Someone else is not affected; a finished job frees a place.
        assert bob.post("/jobs", json=cpu_job()).status_code == 201
        assert alice.post(f"/jobs/{mine[0]}/cancel").json()["status"] == "cancelled"
        assert alice.post("/jobs", json=cpu_job()).status_code == 201
        assert alice.post("/jobs", json=cpu_job()).status_code == 429
        me = alice.get("/me").json()["limits"]
        assert me["active_jobs"] == 3 and me["max_active_jobs"] == 3
    # Admin tokens are exempt.
    for _ in range(4):
        assert stack.client.post("/jobs", json=cpu_job()).status_code == 201
    assert stack.client.get("/me").json()["limits"]["max_active_jobs"] is None


def test_concurrent_submissions_never_pass_the_active_jobs_limit(stack: Stack) -> None:
    """Twelve submissions at once for a user with room for three: three jobs, nine 429s,
    on SQLite as on PostgreSQL (each submission counts inside the write lock)."""
    with user_client(stack, "carol") as carol:
        start = threading.Barrier(12)

        def submit() -> int:
            start.wait()
            return carol.post("/jobs", json=cpu_job()).status_code

        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(lambda _: submit(), range(12)))
        assert sorted(codes) == [201] * 3 + [429] * 9
        assert carol.get("/me").json()["limits"]["active_jobs"] == 3


def test_the_write_rate_is_limited_per_user_across_api_processes(stack: Stack) -> None:
    second = free_port()
    stack.spawn("api2", ["api", "--host", "127.0.0.1", "--port", str(second)])
    wait_until(lambda: _up(second), 30, "the second API process")
    with user_client(stack, "carol") as carol, user_client(stack, "dave") as dave:
        other = httpx.Client(
            base_url=f"http://127.0.0.1:{second}", headers=dict(carol.headers), timeout=30
        )
        # Half the writes through each process: one window for the user.
        for i in range(RATE):
            client = carol if i % 2 else other
            assert client.post("/jobs/j_nope/cancel").status_code == 404
        for client in (carol, other):
            r = client.post("/jobs/j_nope/cancel")
            assert r.status_code == 429, r.text
            assert 1 <= int(r.headers["Retry-After"]) <= 60
            assert r.json()["error"] == "too_many_requests"
            assert r.json()["detail"]["limit"] == f"{RATE} per 1 minute"
        # Reads are not limited, nor is another user.
        assert all(carol.get("/jobs").status_code == 200 for _ in range(RATE + 5))
        assert dave.post("/jobs/j_nope/cancel").status_code == 404
        other.close()


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_a_comparison_counts_one_write_per_job_it_creates(stack: Stack) -> None:
    # The admin: exempt from the active-jobs quota, not from the write rate.
    spec = cpu_job()
    body = {"spec": spec, "precisions": ["fp32", "bf16", "fp16"]}
    for _ in range(RATE // 3):  # 10 comparisons: 30 jobs, the whole window
        r = stack.client.post("/comparisons", json=body)
        assert r.status_code == 201, r.text
    r = stack.client.post("/comparisons", json=body)
    assert r.status_code == 429, r.text  # was 201: one unit for three jobs
    assert r.json()["detail"]["limit"] == f"{RATE} per 1 minute"
    listed = stack.client.get("/jobs", params={"limit": 200}).json()["items"]
    assert len(listed) == RATE


def test_a_message_naming_two_short_values_far_apart_is_kept_whole() -> None:
    # The text between two quoted names is not a quoted value, however long it is.
    from amptrain.server.web.errors import shorten

    message = (
        "model 'vit_b_16' takes images whose sides are multiples of its patch size 16, "
        "but dataset 'synthetic-images' yields 3x40x40"
    )
    assert shorten(message) == message
    long = "path '" + "x" * 100 + "' is outside the data roots"
    assert shorten(long) == f"path '{'x' * 40}...' (100 characters) is outside the data roots"
