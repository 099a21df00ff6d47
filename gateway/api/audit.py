"""The admin audit log: one line per request to the admin API, whoever sent it.

Every request whose canonical path is under ``/admin`` is logged once it is answered: the
method, the canonical path, the client's address, how it authenticated (``token``: the admin
token; ``none``: no credential; ``bad``: a wrong one; ``disabled``: no admin token is
configured, so the API answers 404) and the status it got. Refused probes are logged too: they
are what an operator looks for after an incident. The last entries are also kept in memory
(per worker) for ``GET /admin/audit``.

The query string is not logged (it can hold a tenant name, never a secret, but it is the
caller's free text); neither is any header: the credential itself never reaches a log line.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    from gateway.types import Message, Scope, Send

__all__ = ["AdminAudit", "AuditEntry", "Auth"]

_log = logging.getLogger("gateway.admin.audit")

Auth = Literal["token", "none", "bad", "disabled"]
#: entries kept in memory per worker
KEEP = 1000


class AuditEntry(msgspec.Struct, frozen=True):
    """One admin request, as answered."""

    at_ms: int
    method: str
    path: str
    client: str
    auth: str
    status: int


def client_address(scope: Scope) -> str:
    """``host:port`` of the peer the server saw (a proxy in front shows as itself)."""
    client = scope.get("client")
    if not client:
        return "-"
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class AdminAudit:
    """Logs and keeps the admin requests of this worker."""

    def __init__(self, keep: int = KEEP) -> None:
        self.entries: deque[AuditEntry] = deque(maxlen=keep)

    def record(self, scope: Scope, path: str, auth: Auth, status: int) -> None:
        entry = AuditEntry(int(time.time() * 1000), str(scope.get("method", "")), path,
                           client_address(scope), auth, status)
        self.entries.append(entry)
        level = logging.WARNING if auth in ("none", "bad") else logging.INFO
        _log.log(level, "admin %s %s from %s auth=%s status=%d", entry.method, entry.path,
                 entry.client, auth, status,
                 extra={"admin_method": entry.method, "admin_path": entry.path,
                        "client": entry.client, "admin_auth": auth, "status": status})

    def recent(self, limit: int) -> list[AuditEntry]:
        """The newest ``limit`` entries, newest first."""
        out: list[AuditEntry] = []
        for entry in reversed(self.entries):
            if len(out) >= limit:
                break
            out.append(entry)
        return out

    def watch(self, scope: Scope, path: str, auth: Auth, send: Send) -> tuple[Send, list[int]]:
        """``send`` wrapped to note the status; the caller records once the app returns."""
        seen = [0]

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen[0] = int(message["status"])
            await send(message)

        return watched, seen
