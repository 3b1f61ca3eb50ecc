"""One webhook request: where it may go, what it says, how it is signed and sent.

A destination must be on the operator's allow-list (``AMPTRAIN_WEBHOOK_ALLOWED_HOSTS``),
checked when a rule is created and again before every send. Before connecting, the host
is resolved once and every address it resolves to must be public (unless
``AMPTRAIN_WEBHOOK_ALLOW_PRIVATE``): an allow-listed name pointing at a private,
loopback or link-local address is an SSRF. The request then goes to that resolved
address (pinned: no second lookup a rebinding DNS server could answer differently), with
the original name in ``Host`` and as the TLS server name. Redirects are never followed,
proxies from the environment never used, and every phase has a timeout.

The body is signed: ``X-Amptrain-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">``
with the rule's secret, so a receiver checks both the bytes and their age (replays).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from amptrain.contract.alerts import JobAlert
from amptrain.core.settings import Settings
from amptrain.store.deliveries import Due

SIGNATURE_HEADER = "X-Amptrain-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
ERROR_MAX = 300
RETRIED_STATUSES = frozenset({408, 425, 429})
"""4xx answers worth retrying; any other 3xx or 4xx is the receiver's final word."""


class Refused(Exception):
    """The destination is not allowed (its host, or an address it resolves to)."""


class Unresolved(Exception):
    """The host did not resolve now (DNS down or slow): worth a retry."""


def host_allowed(host: str, allowed: list[str]) -> bool:
    """``host`` is on the allow-list: an exact entry, or under a ``*.domain`` entry."""
    name = host.lower().rstrip(".")
    for entry in allowed:
        if entry.startswith("*."):
            if name.endswith(entry[1:]) and len(name) > len(entry) - 1:
                return True
        elif name == entry:
            return True
    return False


def address_allowed(address: str, allow_private: bool) -> bool:
    """A resolved address a webhook may connect to."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return False
    if ip.is_private or ip.is_loopback or ip.is_link_local:
        return allow_private
    return ip.is_global


def resolve(host: str, port: int, allow_private: bool) -> str:
    """The address to connect to: every address ``host`` resolves to must be allowed
    (one bad answer refuses the lot: which one a connect would pick is not ours to say)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Unresolved(f"cannot resolve {host[:60]!r}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise Refused(f"{host[:60]!r} resolves to no address")
    for address in addresses:
        if not address_allowed(address, allow_private):
            raise Refused(f"{host[:60]!r} resolves to {address}, a disallowed address")
    return addresses[0]


def url_problems(
    rules: Sequence[JobAlert], settings: Settings, loc: tuple[Any, ...] | None
) -> list[dict[str, Any]]:
    """A 422 problem (pydantic's shape, for ``field_problems``) per rule whose webhook host
    is not on the operator's allow-list. ``loc``: where the list of rules is in the body
    (``("alerts",)``); None: the body is the one rule."""
    problems = []
    for i, rule in enumerate(rules):
        if rule.notify is None:
            continue
        host = urlsplit(rule.notify.url).hostname or ""
        if not host_allowed(host, settings.webhook_allowed_hosts):
            where = () if loc is None else (*loc, i)
            problems.append(
                {
                    "loc": (*where, "notify", "url"),
                    "msg": f"webhook host {host[:60]!r} is not on this service's allow-list "
                    "(AMPTRAIN_WEBHOOK_ALLOWED_HOSTS)",
                    "type": "value_error",
                }
            )
    return problems


@dataclass(frozen=True)
class Policy:
    allowed_hosts: list[str]
    allow_private: bool
    timeout_s: float


@dataclass(frozen=True)
class Outcome:
    """One attempt: ``delivered``; else whether a retry may help, and what happened."""

    delivered: bool
    retry: bool
    status_code: int | None
    error: str | None

    def record(self) -> dict[str, Any]:
        return {"at": time.time(), "status_code": self.status_code, "error": self.error}


def idempotency_id(due: Due) -> str:
    return f"amptrain-firing-{due.firing_id}"


def payload(due: Due) -> dict[str, Any]:
    """The JSON a receiver gets (``format: slack``: a Slack ``text`` message as well)."""
    body: dict[str, Any] = {
        "id": idempotency_id(due),
        "firing": due.firing_id,
        "rule": {"id": due.rule_id, "name": due.rule_name},
        "job": {"id": due.job_id, "name": due.job_name, "attempt": due.attempt},
        "step": due.step,
        "fired_at": due.fired_at,
        "data": due.data,
    }
    if due.format == "slack":
        what = due.data.get("event") or due.data.get("series") or due.data.get("reason")
        text = (
            f"amptrain alert {due.rule_name!r}: job {due.job_name!r} ({due.job_id}) "
            f"attempt {due.attempt}, step {due.step}: {what}"
        )
        return {"text": text, "id": body["id"], "amptrain": body}
    return body


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def send(client: httpx.Client, due: Due, policy: Policy) -> Outcome:
    """Send one delivery; never raises for anything the receiver or the network does."""
    try:
        request = _request(due, policy)
    except Refused as exc:
        return Outcome(False, False, None, str(exc)[:ERROR_MAX])
    except Unresolved as exc:
        return Outcome(False, True, None, str(exc)[:ERROR_MAX])
    try:
        with client.stream(
            request.method,
            request.url,
            content=request.content,
            headers=request.headers,
            extensions=request.extensions,
            follow_redirects=False,
        ) as response:
            code = response.status_code  # the body is never read: nothing in it matters
    except httpx.HTTPError as exc:
        return Outcome(False, True, None, f"{type(exc).__name__}: {exc}"[:ERROR_MAX])
    if 200 <= code < 300:
        return Outcome(True, False, code, None)
    if 300 <= code < 400:
        return Outcome(False, False, code, "redirect not followed")
    return Outcome(False, code >= 500 or code in RETRIED_STATUSES, code, f"HTTP {code}")


@dataclass(frozen=True)
class _Prepared:
    method: str
    url: str
    content: bytes
    headers: dict[str, str]
    extensions: dict[str, Any]


def _request(due: Due, policy: Policy) -> _Prepared:
    parts = urlsplit(due.url)
    host = parts.hostname or ""
    if not host_allowed(host, policy.allowed_hosts):
        raise Refused(f"host {host[:60]!r} is not on AMPTRAIN_WEBHOOK_ALLOWED_HOSTS")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = resolve(host, port, policy.allow_private)
    literal = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
    body = json.dumps(payload(due), separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Host": parts.netloc.rsplit("@", 1)[-1],
        "Content-Type": "application/json",
        "User-Agent": "amptrain-webhooks",
        IDEMPOTENCY_HEADER: idempotency_id(due),
        SIGNATURE_HEADER: sign(due.secret, int(time.time()), body),
    }
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return _Prepared("POST", pinned, body, headers, extensions)


def make_client(policy: Policy) -> httpx.Client:
    """The sender's client: no redirects, no proxies from the environment, timeouts on
    every phase (a hanging receiver holds one sending slot for at most that long)."""
    return httpx.Client(
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(policy.timeout_s),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=0),
    )
