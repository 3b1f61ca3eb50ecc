"""The order the test processes receive the suite in (tests/conftest.py): the long tests
start every process's slice, and the tests that share a module's stack arrive in one slice,
one after the other, so that one process starts that stack once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _long_tests_first_in_every_process
from tests.support.shared_stack import MODULE_DATABASE


@dataclass(eq=False)
class Item:
    """The parts of a collected test the ordering reads."""

    name: str
    slow: bool = False
    shares: str | None = None  # the database of the module stack it shares
    path: Path = Path("tests/system/test_module.py")
    fixturenames: list[str] = field(default_factory=list)
    callspec: Any = None

    def __post_init__(self) -> None:
        if self.shares:
            self.fixturenames = [MODULE_DATABASE]
            self.callspec = type("CallSpec", (), {"params": {MODULE_DATABASE: self.shares}})()

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def slices(ordered: list[Item], workers: int) -> list[list[Item]]:
    """The slices worksteal sends the processes (what is left over the processes left)."""
    out, start = [], 0
    for remaining in range(workers, 0, -1):
        size = (len(ordered) - start) // remaining
        out.append(ordered[start : start + size])
        start += size
    return out


def test_a_shared_stack_s_tests_go_to_one_process_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    items = [Item(f"short{n}") for n in range(40)]
    for n in range(6):  # interleaved as a random order leaves them
        items.insert(n * 5, Item(f"slow{n}", slow=True))
        items.insert(n * 5 + 2, Item(f"sqlite{n}", slow=True, shares="sqlite"))
        if n % 2:
            items.insert(n * 5 + 4, Item(f"postgresql{n}", slow=True, shares="postgresql"))

    ordered = _long_tests_first_in_every_process(items)  # type: ignore[arg-type]

    assert sorted(i.name for i in ordered) == sorted(i.name for i in items)
    parts = slices(ordered, 4)  # type: ignore[arg-type]
    for database in ("sqlite", "postgresql"):
        (holder,) = [p for p in parts if any(i.shares == database for i in p)]
        at = [n for n, i in enumerate(holder) if i.shares == database]
        assert at == list(range(at[0], at[0] + len(at))), (database, [i.name for i in holder])
    for part in parts:  # every process starts with long tests; the tails are short to steal
        assert part[0].slow and not part[-1].slow, [i.name for i in part]
    # Dealt to the process with the fewest so far: no process has more than another by
    # more than the largest group (here the 6 sharing SQLite), and the singles fill in.
    long = [sum(i.slow for i in part) for part in parts]
    assert max(long) - min(long) <= 6 - 1 and min(long) >= 3, long
