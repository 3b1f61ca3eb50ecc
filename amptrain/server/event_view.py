"""What of a job's events its owner sees: everything but where it ran.

Workers record, with each event, which worker and processes ran it (the worker's name is
``amptrain-PID@HOST``; the training process's and the ranks' pids, the rendezvous port):
an admin's details, not a job owner's. :func:`owner_view` drops them from an event's
``data``, at any depth. ``GET /jobs/{id}/events`` shows them to admins only; the live
streams share one encoding of each event among all their watchers, so they never carry
them. Checkpoint events name the file and step, never the server's path (the engine).
``GET /workers`` and ``GET /jobs/{id}`` hide the same details from all but admins
(:func:`worker_view`; the job's ``worker``).
"""

from __future__ import annotations

from typing import Any

HOST_DETAIL = frozenset({"worker", "host", "hostname", "pid", "launcher_pid", "rendezvous_port"})


def owner_view(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without :data:`HOST_DETAIL` keys anywhere in it (a new dict)."""
    return {k: _strip(v) for k, v in data.items() if k not in HOST_DETAIL}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return owner_view(value)
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def worker_view(worker: dict[str, Any]) -> dict[str, Any]:
    """A live worker as ``GET /workers`` shows it to all but admins: without its name
    (``amptrain-PID@HOST``) and :data:`HOST_DETAIL` (its host name, its processes' pids)."""
    return {k: v for k, v in owner_view(worker).items() if k != "name"}
