"""Unchecked integers and cursors are 4xx naming the parameter, never a 500 or an aborted
stream: int64 overflows, extreme dates in job-list cursors, over-long queue names."""

from __future__ import annotations

import asyncio
import base64

import pytest
import websockets

from tests.server.web.test_http import cpu_job, fields
from tests.support.live import ws_url
from tests.support.stack import Stack

PAST_INT64 = "9223372036854775808"


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_integers_past_the_columns_are_422(api_stack: Stack) -> None:
    c = api_stack.client
    assert fields(c.post("/jobs", json=cpu_job(max_steps=2**31))) == {"max_steps"}
    assert fields(c.post("/jobs", json=cpu_job(max_steps=10**15))) == {"max_steps"}
    assert fields(c.post("/jobs", json=cpu_job(queue="q" * 64))) == {"queue"}
    assert fields(c.post("/jobs", json=cpu_job(queue="unacked"))) == {"queue"}
    job = c.post("/jobs", json=cpu_job()).json()["id"]
    metrics, events = f"/jobs/{job}/metrics", f"/jobs/{job}/events"
    assert fields(c.get(metrics, params={"after": f"{PAST_INT64}-0"})) == {"query.after"}
    assert fields(c.get(metrics, params={"after": f"0-{PAST_INT64}"})) == {"query.after"}
    assert fields(c.get(metrics, params={"after": "1" * 5000})) == {"query.after"}
    for odd in ("\u0663-\u0663", "1-2\n"):  # Unicode digits, a trailing newline
        assert fields(c.get(metrics, params={"after": odd})) == {"query.after"}
    assert fields(c.get(events, params={"after": PAST_INT64})) == {"query.after"}
    assert fields(c.get(events, params={"after": "9" * 5000})) == {"query.after"}
    for past in (2**31, PAST_INT64):  # steps are 32-bit columns
        window = {"max_points": 10, "from_step": past}
        assert fields(c.get(metrics, params=window)) == {"query.from_step"}
        assert fields(c.get(metrics, params={"max_points": 10, "to_step": past})) == {
            "query.to_step"
        }
    # The largest values that are allowed answer normally.
    assert c.get(events, params={"after": str(2**63 - 1)}).json()["items"] == []
    top = c.get(metrics, params={"after": f"{2**63 - 1}-{2**63 - 1}"})
    assert top.status_code == 200 and top.json()["items"] == []
    huge_window = {"max_points": 10, "from_step": 2**31 - 2, "to_step": 2**31 - 1}
    assert c.get(metrics, params=huge_window).status_code == 200


@pytest.mark.parametrize(
    "stamp",
    [
        "9999-12-31T23:59:59-23:59",  # past year 9999 in UTC
        "0001-01-01T00:00:00+23:59",  # before year 1 in UTC
        "2026-01-01T00:00:00",  # no offset
        "99999-01-01T00:00:00+00:00",
    ],
)
def test_job_list_cursors_with_impossible_dates_are_422(api_stack: Stack, stamp: str) -> None:
    cursor = cursor_of(f"{stamp}|j_{'0' * 32}")
    assert fields(api_stack.client.get("/jobs", params={"cursor": cursor})) == {"query.cursor"}


def test_job_list_cursors_at_the_ends_of_time_page_normally(api_stack: Stack) -> None:
    c = api_stack.client
    job = c.post("/jobs", json=cpu_job()).json()["id"]
    first = cursor_of(f"0001-01-01T00:00:00+00:00|j_{'0' * 32}")
    last = cursor_of(f"9999-12-31T23:59:59.999999+00:00|j_{'f' * 32}")
    assert c.get("/jobs", params={"cursor": first}).json()["items"] == []
    assert [j["id"] for j in c.get("/jobs", params={"cursor": last}).json()["items"]] == [job]
    assert fields(c.get("/jobs", params={"cursor": cursor_of("x" * 5000)})) == {"query.cursor"}


def test_live_cursors_past_int64_are_refused_with_a_reason(api_stack: Stack) -> None:
    c = api_stack.client
    job = c.post("/jobs", json=cpu_job()).json()["id"]
    sse = c.get(f"/jobs/{job}/stream", headers={"Last-Event-ID": f"{PAST_INT64}-0"})
    assert sse.status_code == 422 and fields(sse) == {"header.Last-Event-ID"}
    by_query = c.get(f"/jobs/{job}/stream", params={"after": f"1-{PAST_INT64}"})
    assert fields(by_query) == {"query.after"}

    async def ws_close() -> tuple[int | None, str | None]:
        headers = {"Authorization": f"Bearer {api_stack.token}"}
        async with websockets.connect(
            ws_url(api_stack, job, f"{PAST_INT64}-0"), additional_headers=headers
        ) as ws:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            return ws.close_code, ws.close_reason

    code, reason = asyncio.run(ws_close())
    assert code == 4400 and reason is not None and reason.startswith("after: "), (code, reason)
    assert c.get("/healthz").status_code == 200


def test_long_path_ids_are_404_without_echoing_them(api_stack: Stack) -> None:
    long_id = "j_" + "x" * 4000
    r = api_stack.client.get(f"/jobs/{long_id}")
    assert r.status_code == 404 and len(r.content) < 300, r.text[:300]
    r = api_stack.client.post(f"/jobs/{long_id}/cancel")
    assert r.status_code == 404 and len(r.content) < 300


def test_a_checkpoint_step_is_a_plain_decimal_integer(api_stack: Stack) -> None:
    c = api_stack.client
    job = c.post("/jobs", json=cpu_job()).json()["id"]
    directory = api_stack.root / "checkpoints" / job
    directory.mkdir(parents=True)
    (directory / "step-000000010.pt").write_bytes(b"weights")
    assert c.get(f"/jobs/{job}/checkpoints/10").content == b"weights"
    for odd in ("%2010", "10.0", "010", "+10", "1_0", "1e1", "%D9%A1%D9%A0", "1" * 10):
        response = c.get(f"/jobs/{job}/checkpoints/{odd}")
        assert fields(response) == {"path.step"}, odd
    assert c.get(f"/jobs/{job}/checkpoints/11").status_code == 404


def test_tolerances_are_plain_finite_decimals(api_stack: Stack) -> None:
    c = api_stack.client
    url = "/comparisons/none"
    for name in ("accuracy_points", "eval_loss_relative"):
        for odd in ("1_0", "1e-400", " 1", "nan", "inf", "0x1", "1e400"):
            assert fields(c.get(url, params={name: odd})) == {f"query.{name}"}, (name, odd)
    # Plain values, 0 and exponents included, pass validation (then: no such comparison).
    for fine in ("0", "0.0", "1e-3", "2E-2", ".5", "-0"):
        assert c.get(url, params={"eval_loss_relative": fine}).status_code == 404, fine
