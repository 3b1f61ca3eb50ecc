"""Webhook delivery against real receivers: retried with backoff until the receiver
returns, across an API restart; a hanging or redirecting receiver never stalls the
service; an allow-listed name resolving to a disallowed address is refused."""

from __future__ import annotations

import signal
import time

from amptrain.server import webhooks
from amptrain.store.deliveries import Due
from tests.server.alerts.conftest import started_job
from tests.support.receiver import Receiver, verify
from tests.support.stack import Stack, free_port, wait_until


def _rule(client, name: str, url: str, retries: int = 10) -> dict:  # type: ignore[no-untyped-def]
    body = {
        "name": name,
        "when": {"kind": "event", "events": ["loss_spike"]},
        "notify": {"url": url, "max_retries": retries},
    }
    r = client.post("/alerts/rules", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _deliveries(stack: Stack, rule: dict) -> list[dict]:  # type: ignore[type-arg]
    return list(stack.client.get(f"/alerts/rules/{rule['id']}/deliveries").json()["items"])


def test_deliveries_survive_a_down_receiver_and_an_api_restart(stack: Stack) -> None:
    port = free_port()
    rule = _rule(stack.client, "spikes", f"http://127.0.0.1:{port}/hook")
    job = started_job(stack, stack.client)
    try:
        job.steps(1, 3)
        job.engine_event("warning", 3, code="loss_spike", count=1)
        assert job.sink is not None and job.sink.flush()
        # Refused connections are recorded attempt by attempt, backing off.
        wait_until(
            lambda: (d := _deliveries(stack, rule)) and d[0]["attempts"] >= 2, 30, "two attempts"
        )
        stack.kill("api", signal.SIGTERM)
        (delivery,) = _deliveries_from_db(stack)
        assert delivery["status"] == "pending"
        receiver = Receiver(port)
        try:
            stack.start_api()
            (request,) = wait_until(lambda: receiver.requests, 30, "the retried webhook")
            assert verify(rule["secret"], request)
            (done,) = wait_until(
                lambda: [d for d in _deliveries(stack, rule) if d["status"] == "delivered"],
                30,
                "the delivery recorded",
            )
            assert [h["status_code"] for h in done["history"]][-1] == 204
            assert all(h["error"] for h in done["history"][:-1])  # the refused attempts
            assert len(receiver.requests) == 1
        finally:
            receiver.close()
    finally:
        job.close()


def _deliveries_from_db(stack: Stack) -> list[dict]:  # type: ignore[type-arg]
    import sqlalchemy as sa

    from amptrain.store.db import make_engine
    from amptrain.store.models import AlertDelivery

    engine = make_engine(stack.env["AMPTRAIN_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(AlertDelivery.status, AlertDelivery.attempts))
            return [dict(r._mapping) for r in rows]
    finally:
        engine.dispose()


def test_hanging_and_redirecting_receivers_never_stall_the_service(stack: Stack) -> None:
    hang, redirect, good = Receiver(mode="hang"), Receiver(mode="redirect"), Receiver()
    try:
        rules = [
            _rule(stack.client, "hangs", hang.url()),
            _rule(stack.client, "redirects", redirect.url(), retries=3),
            _rule(stack.client, "good", good.url()),
        ]
        job = started_job(stack, stack.client)
        try:
            job.steps(1, 2)
            job.engine_event("warning", 2, code="loss_spike", count=1)
            assert job.sink is not None and job.sink.flush()
            started = time.monotonic()
            wait_until(lambda: good.requests, 20, "the good receiver's webhook")
            wait_until(lambda: hang.requests, 20, "the hanging receiver to be held")
            # While one request hangs, the API answers and the others were delivered.
            assert stack.client.get("/healthz").status_code == 200
            assert time.monotonic() - started < 10
            (failed,) = wait_until(
                lambda: [d for d in _deliveries(stack, rules[1]) if d["status"] == "failed"],
                20,
                "the redirect recorded",
            )
            # A redirect is the receiver's final word: not followed, not retried.
            assert failed["attempts"] == 1 and failed["history"][0]["status_code"] == 302
            assert len(redirect.requests) == 1
            # The hanging request times out (2 s here) and is retried later.
            (held,) = wait_until(
                lambda: [d for d in _deliveries(stack, rules[0]) if d["attempts"] >= 1],
                20,
                "the hanging attempt timed out",
            )
            assert held["status"] == "pending" and "Timeout" in held["history"][0]["error"]
        finally:
            job.close()
    finally:
        for r in (hang, redirect, good):
            r.close()


def _due(url: str) -> Due:
    return Due(1, "c", url, "json", 0, 0, "s" * 64, 7, 1, "r", "job", "j", 1, 3, {}, 0.0)


def test_allow_listed_names_resolving_to_disallowed_addresses_are_refused() -> None:
    receiver = Receiver()
    try:
        strict = webhooks.Policy(["localhost", "127.0.0.1"], allow_private=False, timeout_s=2)
        loose_names = webhooks.Policy(["*.invalid"], allow_private=False, timeout_s=2)
        with webhooks.make_client(strict) as client:
            for url in (receiver.url(), f"http://localhost:{receiver.port}/hook"):
                out = webhooks.send(client, _due(url), strict)
                assert not out.delivered and not out.retry
                assert "disallowed address" in (out.error or "")
            # A name that does not resolve now is retried later, not given up on.
            out = webhooks.send(client, _due("http://localhost.invalid/h"), loose_names)
            assert out.retry and "cannot resolve" in (out.error or "")
            # Not on the allow-list at all: refused before any lookup.
            out = webhooks.send(client, _due("http://example.com/h"), strict)
            assert "not on AMPTRAIN_WEBHOOK_ALLOWED_HOSTS" in (out.error or "")
        assert receiver.requests == []
        # With private addresses allowed (as the tests run), the same name is delivered
        # to the address it resolved to, with the name in Host.
        loose = webhooks.Policy(["localhost"], allow_private=True, timeout_s=2)
        with webhooks.make_client(loose) as client:
            out = webhooks.send(client, _due(f"http://localhost:{receiver.port}/hook"), loose)
        assert out.delivered, out
        assert receiver.requests[0]["headers"]["Host"] == f"localhost:{receiver.port}"
    finally:
        receiver.close()
    for address in ("10.0.0.1", "169.254.169.254", "::1", "::ffff:127.0.0.1", "0.0.0.0"):
        assert not webhooks.address_allowed(address, allow_private=False), address
    assert webhooks.address_allowed("93.184.216.34", allow_private=False)
    assert webhooks.host_allowed("hooks.example.com", ["*.example.com"])
    assert not webhooks.host_allowed("example.com.evil.io", ["*.example.com", "example.com"])
