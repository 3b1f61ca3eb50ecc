"""schemathesis against the live OpenAPI schema of a real uvicorn, as an admin (with a real
job to aim at) and as an ordinary user: no 5xx, every status documented, every documented
response matching its schema, schema-invalid input refused, unauthenticated calls 401.

Deterministic (fixed seed, no example database) and bounded (a few examples per
operation, one worker). The endless streams (WebSocket, SSE) are left out: they have
their own tests. ``positive_data_acceptance`` is left out because a schema-valid spec
can still name a model or dataset the catalog does not have (422 by design).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.conftest import _database_params
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack, user_client

SEED = 20261202
EXAMPLES = 8

# One database per run: PostgreSQL when the run has one (stricter types: int4/int8
# overflows surface there), else SQLite. The store's own tests cover both.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("database_url", _database_params()[-1:], indirect=True),
    # Three schemathesis processes of a few hundred requests each: 70 s in a quiet suite,
    # 184 s in a loaded one here, and a CI run starved it past the default 300 s.
    pytest.mark.timeout(600),
]


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path, database_url, redis_server)
    # The fuzzer, not the limiters (its unauthenticated calls are failed authentications).
    stack.env["AMPTRAIN_WRITE_RATE_LIMIT"] = "100000/minute"
    stack.env["AMPTRAIN_AUTH_FAILURE_RATE_LIMIT"] = "100000/minute"
    stack.start_api()
    yield stack
    stack.close()


def fuzz(stack: Stack, token: str, config: Path) -> str:
    result = subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
            f"http://127.0.0.1:{stack.port}/openapi.json",
            "--header", f"Authorization: Bearer {token}",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--mode", "all", "--max-examples", str(EXAMPLES), "--seed", str(SEED),
            "--generation-database", "none", "--workers", "1", "--request-timeout", "20",
            "--exclude-path-regex", "/(ws|stream)$", "--no-color",
        ],
        capture_output=True, text=True, timeout=400, cwd=stack.root,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:] + "\n--- api.log\n" + stack.log_tail("api", 40)
    return out


def generated(out: str) -> int:
    found = re.search(r"(\d+) generated, \1 passed", out)
    assert found, out[-2000:]
    return int(found[1])


def test_fuzz_as_admin_and_as_a_user(stack: Stack) -> None:
    job = stack.submit(cpu_job())["id"]
    aimed = stack.root / "admin.toml"
    aimed.write_text(f'[parameters]\njob_id = "{job}"\n')  # reach past the 404s
    admin_cases = generated(fuzz(stack, stack.token, aimed))

    with user_client(stack, "fuzzer") as user:
        token = user.headers["Authorization"].removeprefix("Bearer ")
        assert user.get(f"/jobs/{job}").status_code == 404  # the admin's job is not theirs
    plain = stack.root / "user.toml"
    plain.write_text("")
    user_cases = generated(fuzz(stack, token, aimed)) + generated(fuzz(stack, token, plain))

    print(f"schemathesis requests: admin {admin_cases}, user {user_cases}")
    assert admin_cases > 400 and user_cases > 800, (admin_cases, user_cases)
    log = (stack.root / "api.log").read_text()
    assert "Traceback" not in log and "unhandled error" not in log
