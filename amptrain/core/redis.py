"""Redis: the one client factory and every key name amptrain uses.

Every Redis key is built here from ids amptrain generated itself (job ids,
worker names, slot numbers), never from a user's string, so no request can
name another structure in the same database (Celery's own lists included).
Clients come from :func:`client` / :func:`async_pool` with a timeout chosen for
their use, so a dead Redis never hangs a caller.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

import redis
import redis.asyncio as aioredis

from amptrain.contract.job_ids import JOB_ID

_hiredis: ModuleType | None
try:
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - redis[hiredis] is a dependency
    _hiredis = None

REQUEST_TIMEOUT_S = 2.0
"""Request-path calls (cancel flag, readiness, presence reads) fail fast, never hang a request."""
BLOCKING_READ_TIMEOUT_S = 15.0
"""For clients that block on XREAD/XREADGROUP: must exceed the longest ``block``."""
WORKER_TIMEOUT_S = 5.0
"""Supervisor, presence and the training child's sink: short, they retry on their own."""

_NAME = re.compile(r"^[A-Za-z0-9_.@:\-]{1,200}$")


_PLAIN = frozenset((bytes, str))


def _plain(args: Sequence[Any]) -> bool:
    """Whether a command's arguments are all bytes or str, its name one word."""
    name = args[0]
    return _PLAIN.issuperset(map(type, args)) and (
        " " not in name if type(name) is str else b" " not in name
    )


def _packed(commands: Iterable[Sequence[Any]], general: Any) -> list[bytes]:
    """A pipeline's commands in the protocol: each whose arguments are bytes and str
    (:func:`_plain`) with ONE call of hiredis's packer, the same bytes redis-py's packer
    gives; any other (an int or float argument, a two-word name such as "CONFIG GET") by
    ``general``, redis-py's ``pack_commands``. Why: redis-py runs two Python expressions
    per argument before it calls that packer (~0.35 us each), and the recorder
    acknowledges every entry by id (an XACK of thousands of ids a batch, in a pipeline):
    a third of its acknowledgement's CPU. A command sent alone is packed by redis-py."""
    assert _hiredis is not None  # client() uses these connections only with hiredis
    out: list[bytes] = []
    for args in commands:
        if _plain(args):
            out.append(_hiredis.pack_command(tuple(args)))
        else:
            out += general([args])
    return [b"".join(out)]


class _TCP(redis.Connection):
    def pack_commands(self, commands: Iterable[Sequence[Any]]) -> list[bytes]:
        return _packed(commands, super().pack_commands)


class _Unix(redis.UnixDomainSocketConnection):
    def pack_commands(self, commands: Iterable[Sequence[Any]]) -> list[bytes]:
        return _packed(commands, super().pack_commands)


class _TLS(redis.SSLConnection):
    def pack_commands(self, commands: Iterable[Sequence[Any]]) -> list[bytes]:
        return _packed(commands, super().pack_commands)


_PACKING = {"redis": _TCP, "unix": _Unix, "rediss": _TLS}
"""Per URL scheme, the connection class redis-py would use, packing as :func:`_packed`."""


def client(url: str, timeout: float = REQUEST_TIMEOUT_S) -> redis.Redis:
    """A client whose connects and commands give up after ``timeout`` seconds; its
    pipelines packed as :func:`_packed` says."""
    packing = _PACKING.get(url.partition("://")[0].lower()) if _hiredis else None
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=min(timeout, 2.0),
        socket_timeout=timeout,
        health_check_interval=30,
        **({"connection_class": packing} if packing else {}),
    )


def async_pool(url: str, max_connections: int, timeout: float) -> aioredis.BlockingConnectionPool:
    """A blocking pool for the event loop: callers wait for a connection instead of failing
    (a plain pool broke under 200 watchers)."""
    return aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout,
        socket_connect_timeout=2.0,
        socket_timeout=timeout,
    )


def _job(job_id: str) -> str:
    if not JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a job id: {job_id[:40]!r}")
    return job_id


def _name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"not a worker name: {name[:40]!r}")
    return name


CANCEL_KEY_TTL_S = 7 * 24 * 3600
"""A cancel key (:meth:`Keys.cancel`) outlives any grace period; the job's status in SQL is
the truth, the key only hurries the worker."""


class Keys:
    """Every key name, in one place. Job-scoped keys accept only generated job ids."""

    WORKERS = "amptrain:workers"
    """Set of live worker names (each also has an ``info`` key with a TTL)."""
    DISPATCHER_LEADER = "amptrain:dispatcher:leader"
    """redis-py Lock: the one API process that sweeps the outbox and reconciles leases."""
    RATE_LIMITS = "amptrain:limits"
    """Prefix of the ``limits`` library's per-user write-rate windows."""
    AUTH_FAILURES = "amptrain:authfail"
    """Prefix of the failed-authentication windows, per client address (a digest)."""

    @staticmethod
    def user_live(user: str) -> str:
        """Sorted set of a user's open WebSocket/SSE watchers (member: connection id, score:
        when it lapses unless refreshed). Keyed by a digest: token names are free text."""
        return f"amptrain:user:{hashlib.sha256(user.encode()).hexdigest()[:32]}:live"

    TELEMETRY_PATTERN = "amptrain:job:*:telemetry"
    """Every job's stream (``SCAN MATCH``): :meth:`telemetry` with any job id."""

    @staticmethod
    def telemetry(job_id: str) -> str:
        """The job's stream: metric points and events, in order (see amptrain.contract.stream)."""
        return Keys.TELEMETRY_PATTERN.replace("*", _job(job_id))

    @staticmethod
    def job_of_telemetry(key: str | bytes) -> str:
        """The job id in a :meth:`telemetry` key."""
        text = key.decode() if isinstance(key, bytes) else key
        prefix, _, suffix = Keys.TELEMETRY_PATTERN.partition("*")
        return _job(text.removeprefix(prefix).removesuffix(suffix))

    @staticmethod
    def recorded(job_id: str) -> str:
        """The newest stream entry id the recorder has committed to SQL (and all before it)."""
        return f"amptrain:job:{_job(job_id)}:recorded"

    @staticmethod
    def cancel(job_id: str) -> str:
        """Set by ``POST /jobs/{id}/cancel``; the supervisor polls it (and its heartbeat)."""
        return f"amptrain:job:{_job(job_id)}:cancel"

    @staticmethod
    def reservation(job_id: str) -> str:
        """Hash: the nodes reserved for a multi-node attempt (``nodes`` > 1), written by its
        first node, joined by the others; expires unless the first node renews it."""
        return f"amptrain:job:{_job(job_id)}:nodes"

    @staticmethod
    def node_inbox(job_id: str, attempt: int) -> str:
        """List: what the other nodes of a multi-node attempt tell its first node (the
        precision chosen, each node's outcome), one JSON message each."""
        return f"amptrain:job:{_job(job_id)}:nodes:{int(attempt)}:inbox"

    @staticmethod
    def recorder_owner(job_id: str) -> str:
        """redis-py Lock: which API process records this job's stream."""
        return f"amptrain:recorder:job:{_job(job_id)}"

    @staticmethod
    def worker_info(worker: str) -> str:
        return f"amptrain:worker:{_name(worker)}:info"

    @staticmethod
    def worker_slot(worker: str, slot: int) -> str:
        return f"amptrain:worker:{_name(worker)}:slot:{int(slot)}"
