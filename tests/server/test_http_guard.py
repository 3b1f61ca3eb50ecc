"""The connection guard's descriptor arithmetic (its behaviour against real clients is in
tests/server/web/test_half_open.py)."""

from __future__ import annotations

from amptrain.server.http_guard import RESERVED_FDS, descriptor_plan

INFINITY = -1  # resource.RLIM_INFINITY on Linux


def test_the_cap_follows_the_open_files_limit() -> None:
    assert descriptor_plan(2048, 1024, 1_048_576) == (2048 + RESERVED_FDS, 2048)  # raised
    assert descriptor_plan(2048, 4096, 4096) == (4096, 2048)  # enough already
    assert descriptor_plan(2048, 1024, 1024) == (1024, 1024 - RESERVED_FDS)  # lowered
    assert descriptor_plan(2048, INFINITY, INFINITY) == (INFINITY, 2048)
