"""Every configurable value of the service, read from ``AMPTRAIN_*`` environment variables.

FastAPI-free: the worker imports it too. No other module reads ``os.environ``
for these values; call :func:`get_settings` (cached) or build ``Settings(...)``
explicitly in tests.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    SecretStr,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from amptrain.contract.alerts import MAX_RULES_PER_OWNER
from amptrain.contract.spec import MAX_DEVICES, MAX_NODES
from amptrain.core.nodes import NodeAddress, PortRange

QUEUE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,15}$")
"""At most 16 characters: the width of ``jobs.queue``."""
TRANSPORT_KEYS = frozenset({"unacked", "unacked_index", "unacked_mutex", "celery", "celeryev"})
"""Redis keys kombu's Redis transport uses for itself; a queue of that name would overwrite them."""
GUIDE_DIR = "guide"
"""The documentation site's folder in the data directory: ``amptrain up`` builds it there
and the API serves it at ``/guide/``."""
SHAPE_SUFFIX = re.compile(r"-x([0-9]+)$")
"""How a shape queue's name ends (see :func:`shape_queue`): ``-x2`` .. ``-x{MAX_DEVICES}``."""


def shape_queue(base: str, devices: int) -> str:
    """The queue of ``devices``-device jobs on ``base``: ``base`` itself for one device (so
    ``gpu`` and ``cpu`` stay the one-device queues), else ``base-x{devices}`` (``gpu-x2``)."""
    return base if devices == 1 else f"{base}-x{devices}"


def parse_shape_queue(queue: str) -> tuple[str, int] | None:
    """The inverse of :func:`shape_queue` for a shape queue: ``gpu-x2`` -> ``("gpu", 2)``;
    None for any name :func:`shape_queue` does not make (``gpu``, ``gpu-x02``, ``gpu-x1``)."""
    m = SHAPE_SUFFIX.search(queue)
    if m is None:
        return None
    base, devices = queue[: m.start()], int(m[1])
    return (base, devices) if devices > 1 and shape_queue(base, devices) == queue else None


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def check_proxies(value: list[str]) -> list[str]:
    """The trusted proxies, or a ValueError naming the setting and the first bad entry.
    Checked here because uvicorn takes anything it cannot parse as a literal host name
    that no client address ever equals: a typo would silently trust no proxy."""
    for entry in value:
        if entry == "*":
            if len(value) > 1:
                raise ValueError(
                    "AMPTRAIN_FORWARDED_ALLOW_IPS: '*' trusts every address; list it alone"
                )
            continue
        try:
            ipaddress.ip_network(entry)  # strict: 10.0.0.1/8 has host bits, uvicorn drops it
        except ValueError:
            raise ValueError(
                f"AMPTRAIN_FORWARDED_ALLOW_IPS: {entry[:60]!r} is not an IP address, a "
                "network such as 10.0.0.0/8, or '*'"
            ) from None
    return value


Proxies = Annotated[
    list[str], NoDecode, BeforeValidator(_comma_list), AfterValidator(check_proxies)
]
"""``AMPTRAIN_FORWARDED_ALLOW_IPS``: comma-separated, checked."""

# Each list setting's type carries its own parsing, as ``Proxies`` does: the environment
# gives text, which pydantic-settings would otherwise decode as JSON.
CommaList = Annotated[list[str], NoDecode, BeforeValidator(lambda v: _comma_list(v))]
"""Comma-separated names."""
Queues = Annotated[CommaList, AfterValidator(lambda v: check_queues(v))]
"""Worker queue names: comma-separated, each a name kombu may use as a Redis key."""
Protocols = Annotated[CommaList, AfterValidator(lambda v: [p.lower() for p in v])]
"""fsspec protocols, comma-separated, compared in lower case."""
WebhookHosts = Annotated[CommaList, AfterValidator(lambda v: check_webhook_hosts(v))]
"""``AMPTRAIN_WEBHOOK_ALLOWED_HOSTS``: comma-separated host names or ``*.domain``."""
Roots = Annotated[list[str], NoDecode, BeforeValidator(lambda v: _roots(v))]
"""Data roots: a JSON list, ``os.pathsep``-separated directories, or comma-separated URLs."""


class AlertSettings(BaseSettings):
    """The alert rules' settings (webhook destinations, sending, no-progress checks): a part
    of :class:`Settings`, read with its ``AMPTRAIN_`` prefix like every other."""

    # Field docstrings become descriptions: the settings reference is generated from them.
    model_config = SettingsConfigDict(use_attribute_docstrings=True)

    webhook_allowed_hosts: WebhookHosts = Field(default_factory=list)
    """Hosts alert webhooks may go to, comma-separated: exact names (``hooks.slack.com``)
    or ``*.example.com`` for its subdomains. Empty: no webhooks (a rule's ``notify`` is
    refused with a 422)."""
    webhook_allow_private: bool = False
    """Let webhooks reach private, loopback and link-local addresses. Off: an allow-listed
    name that resolves to one is refused (SSRF); tests on loopback turn it on."""
    webhook_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    """Connect, write and read timeout of one webhook request."""
    webhook_concurrency: int = Field(default=8, ge=1, le=64)
    """Webhooks sent at once by one API process: a hanging receiver holds one of these."""
    webhook_backoff_seconds: float = Field(default=5.0, gt=0, le=3600)
    """Wait before the first retry; each later retry waits twice as long..."""
    webhook_backoff_max_seconds: float = Field(default=600.0, gt=0, le=86400)
    """...up to this."""
    webhook_poll_seconds: float = Field(default=1.0, gt=0, le=60)
    """How often the sender looks for due deliveries."""
    alert_stall_poll_seconds: float = Field(default=10.0, gt=0, le=3600)
    """How often each API process looks for running jobs that made no progress (the
    ``no_progress`` alert rules)."""
    max_alert_rules_per_user: int = Field(default=100, ge=1, le=MAX_RULES_PER_OWNER)
    """Alert rules one user may have (``POST /alerts/rules`` answers 429 beyond)."""


class Settings(AlertSettings):
    """Service settings. Paths left unset derive from ``data_dir``."""

    model_config = SettingsConfigDict(env_prefix="AMPTRAIN_", extra="ignore")

    data_dir: Path = Path(".amptrain")
    """Holds the SQLite file, the embedded Redis, checkpoints and the generated admin token."""
    database_url: str = ""
    """SQLAlchemy URL; default ``sqlite:///{data_dir}/amptrain.db``."""
    redis_url: str = ""
    """Broker, telemetry streams and locks; default the embedded server's ``unix://{data_dir}/redis/redis.sock``."""
    checkpoint_url: str = ""
    """Directory or fsspec URL for checkpoints; default ``{data_dir}/checkpoints``."""
    admin_token: SecretStr | None = None
    """The first admin token; generated (and saved with mode 0600) when unset."""
    data_roots: Roots = Field(default_factory=list)
    """Directories (or URLs) datasets may read from: a JSON list, ``os.pathsep``-separated
    directories, or comma-separated when any is a URL; default ``[{data_dir}/data]``."""
    data_protocols: Protocols = Field(default_factory=lambda: ["file"])
    """Protocols a ``tensors`` path may use (comma-separated), e.g. ``file,s3,gs``; default
    local files only. Every data root must use one of them."""
    data_roots_per_user: bool = False
    """Data roots are shared by every user (default); true makes each user read only
    under ``ROOT/<token name>/`` of every root (weights roots alike)."""
    weights_roots: Roots = Field(default_factory=list)
    """Local directories a spec's ``weights.path`` may read (safetensors files), as data
    roots are written; default ``[{data_dir}/weights]``. A checkpoint export writes into
    the first (``ROOT/<token name>/`` with per-user roots)."""
    job_runtime_default_seconds: int = Field(default=24 * 3600, ge=1)
    """Wall-clock limit of one attempt whose spec gives no ``max_runtime_s``."""
    job_runtime_limit_seconds: int = Field(default=7 * 24 * 3600, ge=1)
    """Largest ``max_runtime_s`` a spec may ask for (more is a 422)."""
    max_job_memory_gib: float | None = Field(default=None, gt=0)
    """Most memory one job may need by the API's estimate from its spec (parameters,
    gradients, optimizer state, synthetic data; more is a 422). Unset: no limit of its own;
    either way a spec whose host memory fits none of the live workers of its queue (by
    what each reports a training process could get) is a 422, and every worker checks
    its dataset and then the fuller estimate against its own memory before allocating."""
    stop_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long `amptrain up` takes at most to stop in order (jobs checkpoint, their telemetry
    is recorded); past it, or on a second Ctrl-C, it kills what is left at once."""
    lease_seconds: float = Field(default=30.0, gt=0)
    """A running attempt's lease; a worker that stops heartbeating loses the job after this long."""
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    """How often a worker renews its lease and checks for cancellation."""
    cancel_grace_seconds: float = Field(default=10.0, ge=0)
    """Time a training child gets to reach a step boundary after a cancel or drain request
    before SIGTERM, and again after SIGTERM before SIGKILL."""
    log_format: Literal["json", "text"] = "json"
    """``json``: one JSON object per line (production); ``text``: human-readable."""
    dispatch_interval_seconds: float = Field(default=3.0, gt=0)
    """How often the dispatcher leader re-sends queued jobs the broker never got."""
    broker_timeout_seconds: float = Field(default=2.0, gt=0)
    """Connect/send timeout towards the broker, so a dead broker never hangs a caller."""
    live_heartbeat_seconds: float = Field(default=10.0, gt=0)
    """Idle WebSocket/SSE watchers get a ``heartbeat`` message this often (keeps proxies
    from closing the socket and lets clients detect a dead server)."""
    live_queue_size: int = Field(default=4096, ge=16)
    """Messages one watcher may fall behind before it gets ``gap`` and is closed (1013)."""
    child_env_passthrough: CommaList = Field(
        default_factory=lambda: ["AWS_*", "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_*"]
    )
    """Environment variables (comma-separated names or ``fnmatch`` patterns) a worker hands
    to its training child beyond locale, paths and CUDA/NCCL/OpenMP/PyTorch tuning: by
    default the object-store credentials fsspec needs for checkpoints and datasets. Nothing
    else reaches the child (no ``AMPTRAIN_*`` setting, token or database password)."""
    recorder_in_api: bool = True
    """Run the recorder (telemetry from Redis into SQL) as a thread of every API process.
    ``false`` when ``amptrain recorder`` processes run beside the API: on a busy service the
    recorder then has a core and a GIL of its own instead of sharing the API's, whose
    requests and live watchers wait while it parses and inserts (see the README's
    "Scaling the recorder"). Any number of recorders may run; each job has one at a time."""
    warm_spare: bool = True
    """Each worker pool slot keeps one training process started ahead of time, with torch,
    the engine and the built-in components imported but CUDA never touched, and hands it
    the next job (it runs that one attempt and exits): a job starts without waiting for a
    fresh interpreter to import torch. A spare costs one idle process's memory per slot.
    ``false``: every attempt starts a fresh process on demand."""
    queues: Queues = Field(default_factory=lambda: ["gpu", "cpu"])
    """Worker queues a job may name (comma-separated), e.g. ``gpu,cpu,gpu-a100``. kombu
    keeps each queue as a Redis list of that very name, so a job may only pick one of
    these (or one of their shape queues, see :attr:`routable_queues`), and a name that
    collides with the transport's own keys is refused here."""

    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest request body the API reads; a longer one is refused with 413 before it is
    parsed (counted as it arrives, so chunked bodies are cut off too)."""
    max_spec_bytes: int = Field(default=16 * 1024, ge=1024)
    """Largest job spec (as canonical JSON) ``POST /jobs`` stores; it is returned by every
    ``GET /jobs`` page, so this bounds listings."""
    max_page_bytes: int = Field(default=1024 * 1024, ge=64 * 1024)
    """``GET /jobs`` ends a page early (with a ``next_cursor``) once its specs reach this size."""
    max_active_jobs_per_user: int = Field(default=50, ge=1)
    """Queued + running jobs one token may have; more is a 429 naming the limit and the
    use. Admin tokens are exempt."""
    max_live_connections_per_user: int = Field(default=20, ge=1, le=128)
    """Concurrent WebSocket + SSE watchers per token, across every API process (at most
    128: half the live hub's 256 Redis connections, so one user cannot take them all).
    Admin tokens are exempt."""
    write_rate_limit: str = "120/minute"
    """Writes (POST, PUT, PATCH, DELETE) per token, in ``limits`` notation (``10/second``,
    ``120/minute;1000/hour``), shared by every API process through Redis; more is a 429
    with ``Retry-After``."""
    max_connections: int = Field(default=2048, ge=16, le=1_000_000)
    """Open connections one API process holds (WebSockets included): one more closes the one
    waiting longest for its next request (idle or half-sent), else gets 503; each logged.
    The open-files limit is raised to fit, or the cap lowered (and said so)."""
    request_read_timeout_seconds: float = Field(default=20.0, gt=0, le=3600)
    """A connection must deliver its whole request (headers and body) within this long of
    opening, or of its first byte after a response; else 408 and closed."""
    response_write_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Once over 64 KiB of responses wait for a client that is not reading, it must take
    48 KiB within this long, else its connection is closed (HTTP, SSE and WebSockets)."""
    max_connections_per_address: int = Field(default=64, ge=0, le=1_000_000)
    """Connections per client address and API process (one more: 503); 0: off, behind a proxy."""
    auth_failure_rate_limit: str = "30/minute"
    """Failed authentications per client address (``limits`` notation), across API processes
    through Redis; past it the address's bad or missing tokens get 429 with ``Retry-After``
    (a valid token always passes). The address: see :attr:`forwarded_allow_ips`."""
    forwarded_allow_ips: Proxies = Field(default_factory=list)
    """Proxies whose ``X-Forwarded-For`` names the client: IP addresses or networks
    (comma-separated), or ``*`` where only the proxy reaches the API; default none."""
    max_nodes: int = Field(default=MAX_NODES, ge=1, le=MAX_NODES)
    """Most ``nodes`` a job may ask for here (more is a 422 naming ``nodes``)."""
    node_address: NodeAddress = ""
    """Where the other nodes of a multi-node job reach this worker (IP or host name); empty:
    the address it routes outwards through (:func:`amptrain.core.nodes.node_address`)."""
    rdzv_ports: PortRange = (29400, 29499)
    """``LOW-HIGH``: the ports a leading worker picks the c10d rendezvous port from."""
    node_wait_seconds: float = Field(default=60.0, ge=1, le=3600)
    """How long a multi-node job's first node waits for the others (then: given back)."""
    token_recheck_seconds: float = Field(default=5.0, gt=0)
    """An open WebSocket or SSE stream re-checks its token (revoked? expired?) at its next
    message once this long has passed since the last check."""

    _redis_derived: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _derive_defaults(self) -> Settings:
        # Absolute, so child processes started elsewhere find the same files.
        data_dir = self.data_dir = self.data_dir.absolute()
        if not self.database_url:
            self.database_url = f"sqlite:///{data_dir / 'amptrain.db'}"
        if not self.redis_url:
            self.redis_url = f"unix://{self.embedded_redis_dir / 'redis.sock'}"
            self._redis_derived = True
        if not self.checkpoint_url:
            self.checkpoint_url = str(data_dir / "checkpoints")
        if not self.data_roots:
            self.data_roots = [str(data_dir / "data")]
        if not self.weights_roots:
            self.weights_roots = [str(data_dir / "weights")]
        return self

    @model_validator(mode="after")
    def _roots_use_allowed_protocols(self) -> Settings:
        for root in self.data_roots:
            match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", root)
            protocol = match[1].lower() if match else "file"
            if protocol not in self.data_protocols:
                raise ValueError(
                    f"data root {root!r} uses protocol {protocol!r}, which data_protocols "
                    f"({', '.join(self.data_protocols)}) does not allow"
                )
        for root in self.weights_roots:
            if "://" in root:  # opened beneath a directory descriptor, never through fsspec
                raise ValueError(f"weights root {root!r} must be a local directory, not a URL")
        return self

    @property
    def routable_queues(self) -> list[str]:
        """Every queue a job may go to: the configured ``queues`` and, for each, its shape
        queues ``-x2`` .. ``-x8`` (workers started with ``--devices-per-job``) that fit the
        16 characters of a queue name. Derived names cannot collide with kombu's own keys."""
        names = list(self.queues)
        for base in self.queues:
            for n in range(2, MAX_DEVICES + 1):
                name = shape_queue(base, n)
                if QUEUE_NAME.match(name) and name not in names:
                    names.append(name)
        return names

    @property
    def embedded_redis_dir(self) -> Path:
        """Where ``amptrain up`` runs its private redis-server (its socket is ``redis.sock`` inside)."""
        return self.data_dir / "redis"

    @property
    def wants_embedded_redis(self) -> bool:
        """No Redis was configured: ``redis_url`` is where ``amptrain up`` starts its own."""
        return self._redis_derived

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / "admin-token"

    @property
    def broker_url(self) -> str:
        """``redis_url`` spelled the way kombu wants it (unix sockets are ``redis+socket://``)."""
        return celery_broker_url(self.redis_url)


def _roots(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        # URLs hold ':' themselves (``s3://b``, ``ftp://h:21/x``): list them with commas.
        sep = "," if "://" in text else os.pathsep
        return [part.strip() for part in text.split(sep) if part.strip()]
    return value


_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$")


def check_webhook_hosts(value: list[str]) -> list[str]:
    """Lower-cased host names (``*.`` for subdomains), or a ValueError naming the bad one."""
    hosts = [h.lower().rstrip(".") for h in value]
    for host in hosts:
        if not _HOST.match(host) or len(host) > 253:
            raise ValueError(
                f"AMPTRAIN_WEBHOOK_ALLOWED_HOSTS: {host[:60]!r} is not a host name or *.domain"
            )
    return hosts


def check_queues(value: list[str]) -> list[str]:
    """The configured queues, or a ValueError naming the first one not allowed."""
    for name in value:
        if not QUEUE_NAME.match(name) or name in TRANSPORT_KEYS or name.startswith("amptrain"):
            raise ValueError(
                f"queue name {name!r} is not allowed: lowercase letters, digits, '.', '_', "
                f"'-' (at most 16) and none of {sorted(TRANSPORT_KEYS)}"
            )
        if SHAPE_SUFFIX.search(name):
            # Else `amptrain up` would start a one-device worker on it, which fails
            # every job routed there with devices_mismatch.
            raise ValueError(
                f"queue name {name!r} is a shape queue, derived from its base queue: "
                "list the base queue and start its workers with --devices-per-job"
            )
    if "gpu" not in value or "cpu" not in value:
        raise ValueError("queues must include the default queues 'gpu' and 'cpu'")
    return value


def celery_broker_url(redis_url: str) -> str:
    """Translate a redis-py URL into a kombu broker URL."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
