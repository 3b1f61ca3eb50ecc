"""Refusing what cannot fit before it is allocated: bytes a dataset is about to hold against
the memory this training process can still get (:mod:`amptrain.contract.host_memory`).

A job that would not fit fails with ``too_large`` naming both numbers, instead of the kernel
killing the worker halfway through an allocation (measured in issue 25: a 185 GiB synthetic
dataset was accepted on a 23.5 GiB machine, and only the kernel refused its first 61 GiB).
"""

from __future__ import annotations

from amptrain.contract import host_memory
from amptrain.contract.errors import TooLargeError
from amptrain.contract.sizing import format_bytes


def require_memory(needed: int, what: str) -> None:
    """Raise :class:`TooLargeError` when ``needed`` bytes (``what`` says of what: "the
    dataset synthetic-classification") exceed the memory available to this process now."""
    free = host_memory.available()
    if free is None or needed <= free:
        return
    size = host_memory.total()
    machine = f" of {format_bytes(size)}" if size is not None else ""
    raise TooLargeError(
        f"too large for this worker: {what} needs about {format_bytes(needed)} of memory, but "
        f"the training process has {format_bytes(free)} available here{machine}"
    )
