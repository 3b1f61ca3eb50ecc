"""The settings of a worker's part in multi-node jobs (``nodes`` > 1): its address and the
rendezvous port range, validated (each error names its ``AMPTRAIN_*`` variable), and the
address a worker uses when none is configured."""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_settings import NoDecode

HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*$"
)
MAX_RDZV_PORTS = 10_000
"""Widest rendezvous port range: one port per multi-node attempt led by this worker."""


def check_node_address(value: str) -> str:
    """An IP address or a DNS host name (what the other nodes connect to), or empty (then
    :func:`detect_node_address` picks one); a ValueError naming the setting otherwise."""
    if not value:
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not HOST_NAME.match(value):
        raise ValueError(
            f"AMPTRAIN_NODE_ADDRESS: {value[:60]!r} is neither an IP address nor a host name"
        )
    return value


def detect_node_address() -> str:
    """The address of the interface this machine routes outwards through (a UDP socket
    "connected" to a documentation address sends nothing), else 127.0.0.1: a guess, right
    on a machine with one network; set ``AMPTRAIN_NODE_ADDRESS`` on any other."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed to anyone
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def parse_port_range(value: Any) -> Any:
    """``"29400-29499"`` -> ``(29400, 29499)``; a ValueError naming the setting otherwise."""
    if not isinstance(value, str):
        return value
    m = re.fullmatch(r"\s*([0-9]{1,5})\s*-\s*([0-9]{1,5})\s*", value)
    if m is None:
        raise ValueError(f"AMPTRAIN_RDZV_PORTS: {value[:40]!r} is not a range such as 29400-29499")
    return (int(m[1]), int(m[2]))


def check_port_range(value: tuple[int, int]) -> tuple[int, int]:
    low, high = value
    if not 1024 <= low <= high <= 65535 or high - low >= MAX_RDZV_PORTS:
        raise ValueError(
            f"AMPTRAIN_RDZV_PORTS: {low}-{high} must lie within 1024-65535, low to high, "
            f"at most {MAX_RDZV_PORTS} ports"
        )
    return value


def node_address(configured: str) -> str:
    """Where the other nodes reach this one: the configured ``AMPTRAIN_NODE_ADDRESS``, else
    :func:`detect_node_address`."""
    return configured or detect_node_address()


NodeAddress = Annotated[str, AfterValidator(lambda v: check_node_address(v.strip()))]
PortRange = Annotated[
    tuple[int, int],
    NoDecode,
    BeforeValidator(lambda v: parse_port_range(v)),
    AfterValidator(lambda v: check_port_range(v)),
]
