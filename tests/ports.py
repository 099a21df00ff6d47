"""Free TCP ports for the servers the tests start (the one copy of this helper in tests/).

A port is the kernel's pick for ``bind((host, 0))``, closed again before it is returned: free
now, bound by the server a moment later (another process could take it in between; on a test
box that is rare enough). ``free_ports(n)`` holds its sockets until all ``n`` are picked, so the
ports differ from each other. ``bus_offset`` also requires ``port + bus_offset`` to be free
(Redis Cluster's bus port is the client port + 10000).
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["free_port", "free_ports"]

LOOPBACK = "127.0.0.1"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bindable(host: str, port: int) -> bool:
    with socket.socket(_family(host)) as s, contextlib.suppress(OSError):
        s.bind((host, port))
        return True
    return False


def free_ports(n: int, host: str = LOOPBACK, *, bus_offset: int | None = None) -> list[int]:
    """``n`` distinct free TCP ports on ``host`` (IPv4 or IPv6, by its spelling)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(held) < n:
            s = socket.socket(_family(host))
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            if bus_offset is not None and (
                port + bus_offset > 65535
                or not _bindable(host, port + bus_offset)
                or {port, port + bus_offset} & {q + d for q in ports for d in (0, bus_offset)}
            ):
                s.close()
                continue
            held.append(s)
            ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


def free_port(host: str = LOOPBACK, *, bus_offset: int | None = None) -> int:
    """One free TCP port on ``host``."""
    return free_ports(1, host, bus_offset=bus_offset)[0]
