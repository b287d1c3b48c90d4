"""Cluster addresses: ``"host:port"`` checked, split, and brought to the form equivalent addresses share.

An IPv6 host is written in brackets (``"[::1]:2222"``). This module never imports TensorFlow.
"""

import ipaddress
import re
from typing import Any, Tuple

from tfaccel.cluster.errors import fail
from tfaccel.cluster.limits import MAX_DIGITS, shorten

__all__ = ["EXAMPLE", "split_address", "socket_address", "check_address", "canonical_address"]

_HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.\-]*[A-Za-z0-9_])?$")
EXAMPLE = '"10.0.0.2:2222"'  # what error messages suggest


def split_address(address: str) -> Tuple[str, int]:
    """Splits a validated ``"host:port"`` (IPv6 hosts in brackets: ``"[::1]:2222"``) into host and port."""
    host, _, port = address.rpartition(":")
    return host, int(port)


def socket_address(address: str) -> Tuple[str, int]:
    """``(host, port)`` of a validated ``"host:port"`` as sockets take it: an IPv6 host without its brackets.

    Example:
        >>> socket_address("[::1]:2222"), socket_address("localhost:2222")
        (('::1', 2222), ('localhost', 2222))
    """
    host, port = split_address(address)
    return host.strip("[]"), port


def check_address(source: str, field: str, value: Any) -> str:
    """Checks one ``"host:port"`` of a cluster description and returns it.

    Raises:
        ClusterConfigError: the value is not a string, has whitespace or a protocol, lacks a port, has a port
            outside 1-65535 or with leading zeros, an empty or malformed host, or an IPv6 host without brackets;
            the message starts with ``<source>: <field> <value>``.
    """
    if not isinstance(value, str):
        kind = type(value).__name__
        hint = (" (YAML reads off/on/yes/no as booleans and bare numbers as numbers)"
                if isinstance(value, (bool, int, float)) else "")
        return fail(source, field, value, f"must be a \"host:port\" string, got {kind}{hint}; quote it, "
                    f"e.g. {EXAMPLE}")
    if value != value.strip() or any(ch.isspace() for ch in value):
        fail(source, field, value, f"contains whitespace; write it as \"host:port\", e.g. {EXAMPLE}")
    if "://" in value:
        fail(source, field, value, f"must not carry a protocol; write only \"host:port\", e.g. {EXAMPLE}")
    if ":" not in value:
        fail(source, field, value, f"port is missing; write it as \"host:port\", e.g. {EXAMPLE}")
    host, _, port = value.rpartition(":")
    if not port:
        fail(source, field, value, f"port is missing; write it as \"host:port\", e.g. {EXAMPLE}")
    if not port.isdigit() or not port.isascii():
        fail(source, field, value, f"port must be a number 1-65535, got {shorten(port, 40)!r}; e.g. {EXAMPLE}")
    if len(port) > MAX_DIGITS or not 1 <= int(port) <= 65535:
        fail(source, field, value, "port must be 1-65535")
    if str(int(port)) != port:
        fail(source, field, value, f"port has leading zeros; write {host}:{int(port)}")
    if not host:
        fail(source, field, value, f"host is empty; write it as \"host:port\", e.g. {EXAMPLE}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            fail(source, field, value, "host in brackets must be an IPv6 address, e.g. \"[::1]:2222\"")
    elif ":" in host:
        fail(source, field, value, "an IPv6 host must be written in brackets, e.g. \"[::1]:2222\"")
    elif len(host) > 253:
        fail(source, field, value, f"host is {len(host)} characters long; a host name has at most 253")
    elif not _HOST_RE.match(host) or ".." in host:
        fail(source, field, value, "host must be a hostname or IP address (letters, digits, '.', '-', '_')")
    return value


def canonical_address(address: str) -> str:
    """The form two equivalent addresses share: host names lowercased, ``localhost`` = ``127.0.0.1``, IPv6
    compressed (``[0:0::1]`` = ``[::1]``, an IPv4-mapped one as its IPv4 address). ``address`` is valid.

    Example:
        >>> canonical_address("LocalHost:2222"), canonical_address("[0:0::1]:2222")
        ('127.0.0.1:2222', '[::1]:2222')
    """
    host, port = split_address(address)
    if host.startswith("["):
        ip = ipaddress.IPv6Address(host[1:-1])
        host = str(ip.ipv4_mapped) if ip.ipv4_mapped is not None else f"[{ip.compressed}]"
    else:
        host = host.lower()
        if host == "localhost":
            host = "127.0.0.1"
    return f"{host}:{port}"
