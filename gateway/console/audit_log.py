"""The console's side of the admin audit log: its actions written to it, its entries read back.

The admin API's audit (:mod:`gateway.api.audit`) writes one line per admin request to the
``gateway.admin.audit`` logger. The console writes each of its own actions there too, as the
same kind of line (``admin_method``, ``admin_path``, ``client``, ``admin_auth``, ``status``)
plus who did it and what (``console_actor``, ``console_action``): sign-ins (failed ones too),
sign-outs, key creations and revocations, rollout actions. :class:`AuditTrail` keeps the last
entries of that logger (the API's and the console's) in memory for the operator's audit page,
newest first: like ``GET /admin/audit``, one worker's entries; the log has every worker's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

__all__ = ["AUDIT_LOGGER", "AuditRow", "AuditTrail", "audit_trail"]

AUDIT_LOGGER = "gateway.admin.audit"
#: entries kept in memory per worker
KEEP = 1000


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One audit entry as the audit page shows it."""

    at_ms: int
    method: str
    path: str
    client: str
    auth: str
    status: int
    actor: str = ""
    action: str = ""

    @property
    def at(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.at_ms / 1000))


class AuditTrail(logging.Handler):
    """Keeps the entries of the audit logger (a logging handler on it)."""

    def __init__(self, keep: int = KEEP) -> None:
        super().__init__(logging.DEBUG)
        self.rows: deque[AuditRow] = deque(maxlen=keep)
        self._log = logging.getLogger(AUDIT_LOGGER)

    def emit(self, record: logging.LogRecord) -> None:
        path = getattr(record, "admin_path", None)
        if path is None:
            return
        self.rows.append(AuditRow(
            int(record.created * 1000), str(getattr(record, "admin_method", "")), str(path),
            str(getattr(record, "client", "-")), str(getattr(record, "admin_auth", "")),
            int(getattr(record, "status", 0)), str(getattr(record, "console_actor", "")),
            str(getattr(record, "console_action", ""))))

    def record(self, path: str, client: str, actor: str, action: str, status: int,
               method: str = "POST") -> None:
        """Write one console action to the audit log (``actor``: ``operator`` or
        ``tenant <name>``; ``action``: what was done, never a secret)."""
        level = logging.WARNING if status >= 400 else logging.INFO
        self._log.log(level, "console %s by %s from %s: %s status=%d", path, actor, client,
                      action, status,
                      extra={"admin_method": method, "admin_path": path, "client": client,
                             "admin_auth": "console", "status": status,
                             "console_actor": actor, "console_action": action})

    def page(self, offset: int, limit: int) -> tuple[list[AuditRow], bool]:
        """Entries ``offset .. offset+limit`` newest first, and whether older ones follow."""
        rows = list(self.rows)
        rows.reverse()
        return rows[offset:offset + limit], len(rows) > offset + limit


_trail: AuditTrail | None = None
_lock = threading.Lock()


def audit_trail() -> AuditTrail:
    """This process's trail, attached to the audit logger on first use (once)."""
    global _trail
    with _lock:
        if _trail is None:
            _trail = AuditTrail()
            logging.getLogger(AUDIT_LOGGER).addHandler(_trail)
        return _trail
