"""What ``on_corrupt`` does with a file or record that does not decode, for every dataset
read from disk: ``fail`` stops the job naming it; ``skip`` notes it (the dataset serves the
next sample in its place) until more than ``max_skipped`` distinct ones were seen in this
process. The data path collects the noted ones (``take``) for the ``data_skipped`` event.

Safe in builder threads (a lock) and in loader processes: a forked or unpickled copy starts
its own count, so a record noted before a fork is reported once, by the process that saw it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from amptrain.contract.errors import InvalidSpecError


class Skips:
    """The policy, and the bad records seen in this process (as the user would name them)."""

    def __init__(
        self, field: str, policy: str, limit: int, shown: Callable[[str], str] = str
    ) -> None:
        self.field = field
        """The argument the records belong to (``dataset.args.path``), for the errors."""
        self.policy = policy
        self.limit = limit
        self.shown = shown
        """How a record appears in an error (e.g. quoted and shortened)."""
        self._fresh()

    def _fresh(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._new: dict[str, None] = {}  # ordered, no repeats

    def _mine(self) -> threading.Lock:
        """This process's lock: a forked copy starts afresh (the parent's lock may have been
        held by another thread at the fork)."""
        if self._pid != os.getpid():
            self._fresh()
        return self._lock

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_pid", "_lock", "_seen", "_new"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fresh()

    def known(self, record: str) -> bool:
        """Whether ``record`` was already found bad here (not decoded again)."""
        with self._mine():
            return record in self._seen

    def bad(self, record: str, why: str) -> None:
        """``record`` does not decode: raise for ``fail`` (and past ``max_skipped``), else
        note it skipped."""
        if self.policy == "fail":
            raise InvalidSpecError(
                f"{self.field}: {self.shown(record)}: {why}; dataset.args.on_corrupt 'skip' uses "
                "the next "
                "sample in its place"
            )
        with self._mine():
            self._seen.add(record)
            self._new[record] = None
            too_many = len(self._seen) > self.limit
        if too_many:
            raise InvalidSpecError(
                f"dataset.args.max_skipped: more than {self.limit} bad files or records in "
                f"{self.field}; the last: {self.shown(record)}: {why}"
            )

    def take(self) -> list[str]:
        """The records skipped since the last call in this process (then forgotten)."""
        with self._mine():
            taken = list(self._new)
            self._new.clear()
        return taken
