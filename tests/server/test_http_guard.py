"""The connection guard's arithmetic, write deadline and settings (its behaviour against real
clients is in tests/server/web/test_half_open.py and test_slow_readers.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from amptrain.core.settings import Settings
from amptrain.server.http_guard import (
    RESERVED_FDS,
    ConnectionGuard,
    _WriteDeadline,
    descriptor_plan,
)

INFINITY = -1  # resource.RLIM_INFINITY on Linux


def test_the_cap_follows_the_open_files_limit() -> None:
    assert descriptor_plan(2048, 1024, 1_048_576) == (2048 + RESERVED_FDS, 2048)  # raised
    assert descriptor_plan(2048, 4096, 4096) == (4096, 2048)  # enough already
    assert descriptor_plan(2048, 1024, 1024) == (1024, 1024 - RESERVED_FDS)  # lowered
    assert descriptor_plan(2048, INFINITY, INFINITY) == (INFINITY, 2048)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AMPTRAIN_RESPONSE_WRITE_TIMEOUT_SECONDS", "0"),
        ("AMPTRAIN_RESPONSE_WRITE_TIMEOUT_SECONDS", "-1"),
        ("AMPTRAIN_RESPONSE_WRITE_TIMEOUT_SECONDS", "nan"),
        ("AMPTRAIN_RESPONSE_WRITE_TIMEOUT_SECONDS", "inf"),
        ("AMPTRAIN_RESPONSE_WRITE_TIMEOUT_SECONDS", "3601"),
        ("AMPTRAIN_MAX_CONNECTIONS_PER_ADDRESS", "-1"),
        ("AMPTRAIN_MAX_CONNECTIONS_PER_ADDRESS", "1000001"),
        ("AMPTRAIN_MAX_CONNECTIONS_PER_ADDRESS", "many"),
    ],
)
def test_hostile_limits_are_refused_naming_the_setting(
    name: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    field = name.removeprefix("AMPTRAIN_").lower()
    with pytest.raises(ValidationError, match=field):
        Settings(data_dir=tmp_path)


class _Conn:
    def __init__(self, client: tuple[str, int] | None) -> None:
        self.client = client
        self.transport = _Transport(self)


class _Transport:
    def __init__(self, protocol: object) -> None:
        self.protocol = protocol
        self.aborted = False

    def get_extra_info(self, name: str) -> None:
        return None

    def get_protocol(self) -> object:
        return self.protocol

    def abort(self) -> None:
        self.aborted = True


def test_paused_writes_that_do_not_resume_in_time_abort_the_connection() -> None:
    async def main() -> tuple[bool, bool]:
        guard = ConnectionGuard(16, 20.0, write_timeout_s=0.05)
        slow, quick = _Conn(("10.0.0.1", 1)), _Conn(None)
        deadlines = [_WriteDeadline(guard, slow), _WriteDeadline(guard, quick)]
        for deadline in deadlines:
            deadline.arm()  # asyncio paused writes
        deadlines[1].disarm()  # ... and resumed them for the quick one
        await asyncio.sleep(0.2)
        return slow.transport.aborted, quick.transport.aborted

    assert asyncio.run(main()) == (True, False)


def test_each_address_holds_at_most_its_share() -> None:
    guard = ConnectionGuard(16, 20.0, per_address=2)
    a, b, c, other = object(), object(), object(), object()
    assert guard.admit(a, ("10.0.0.1", 1)) and guard.admit(b, ("10.0.0.1", 2))
    assert not guard.admit(c, ("10.0.0.1", 3))
    assert guard.admit(other, ("10.0.0.2", 1))
    guard.release(a)
    guard.release(c)  # never counted: nothing to give back
    assert guard.admit(c, ("10.0.0.1", 3))
    for t in (b, c, other):
        guard.release(t)
    assert guard.held == {} and guard.addresses == {}
    assert ConnectionGuard(16, 20.0).admit(a, ("10.0.0.1", 1))  # 0: no limit
