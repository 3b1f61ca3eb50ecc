"""``amptrain token create --expires|list|revoke`` as real processes against a real API:
``GET /me`` shows the token, and a revoked or expired one gets 401 saying so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.cli.test_server_commands import amptrain, clean_env
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow


def _me(stack: Stack, token: str) -> httpx.Response:
    return httpx.get(
        f"{stack.client.base_url}/me", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def test_token_lifecycle_from_the_command_line(api_stack: Stack) -> None:
    env = clean_env(
        AMPTRAIN_DATA_DIR=str(api_stack.root),
        AMPTRAIN_DATABASE_URL=api_stack.env["AMPTRAIN_DATABASE_URL"],
    )
    made = amptrain("token", "create", "alice", "--expires", "30d", env=env)
    assert made.returncode == 0, made.stderr
    alice = made.stdout.strip()
    brief = amptrain("token", "create", "brief", "--expires", "2s", env=env)
    assert brief.returncode == 0, brief.stderr

    me = _me(api_stack, alice)
    assert me.status_code == 200, me.text
    body = me.json()
    assert body["name"] == "alice" and body["admin"] is False
    expires = datetime.fromisoformat(body["expires_at"])
    assert timedelta(days=29) < expires - datetime.now(UTC) <= timedelta(days=30)
    assert body["limits"]["active_jobs"] == 0 and body["limits"]["max_active_jobs"] == 50
    assert api_stack.client.get("/me").json()["admin"] is True

    listing = amptrain("token", "list", env=env)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:]}
    assert rows["alice"][1:3] == ["user", "active"] and rows["admin"][1:3] == ["admin", "active"]
    assert alice not in listing.stdout  # never the token itself

    revoked = amptrain("token", "revoke", "alice", env=env)
    assert revoked.returncode == 0 and revoked.stdout.startswith("revoked alice at ")
    refused = _me(api_stack, alice)
    assert refused.status_code == 401
    assert refused.json() == {"error": "unauthorized", "detail": "token 'alice' was revoked"}
    assert refused.headers["www-authenticate"] == "Bearer"

    expired = wait_until(
        lambda: (r := _me(api_stack, brief.stdout.strip())).status_code == 401 and r,
        10,
        "the 2 s token to expire",
    )
    assert expired.json()["detail"] == "token 'brief' has expired"
    states = {
        line.split()[0]: line.split()[2]
        for line in amptrain("token", "list", env=env).stdout.splitlines()[1:]
    }
    assert states == {"admin": "active", "alice": "revoked", "brief": "expired"}

    assert _me(api_stack, "amp_never-issued").json()["detail"] == "unknown bearer token"
    nobody = amptrain("token", "revoke", "nobody", env=env)
    assert nobody.returncode == 1 and "no token named 'nobody'" in nobody.stderr
    bad = amptrain("token", "create", "carol", "--expires", "1y", env=env)
    assert bad.returncode == 2 and "not a duration" in bad.stderr
