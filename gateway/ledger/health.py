"""Whether the ledger can make records durable now, told once per change of state.

A ledger that can neither commit nor spool (a full disk under both, an I/O error) retries
every flush interval; logging each attempt floods the log (two tracebacks every 50 ms, onto
the same full disk) and tells an operator nothing new. This holds the state instead: the first
failure logs one error line, the recovery logs one line with how many attempts failed and for
how long, and the state itself is what ``/readyz`` (503 while failing, so a load balancer
drains the replica) and ``gateway_ledger_durable`` read.
"""

from __future__ import annotations

import logging
import time

__all__ = ["Durability"]

log = logging.getLogger("gateway.ledger")


class Durability:
    """Failing or not, since when, and how many attempts failed; pure state, no I/O."""

    __slots__ = ("failures", "ok", "since", "what")

    def __init__(self, what: str = "usage records") -> None:
        self.what = what
        self.ok = True
        self.failures = 0
        self.since = 0.0

    def __repr__(self) -> str:
        if self.ok:
            return "<Durability [ok]>"
        return (f"<Durability [failing {time.monotonic() - self.since:.1f}s | "
                f"attempts: {self.failures}]>")

    def failed(self, exc: BaseException) -> None:
        """An attempt to make records durable failed; logs only when the state changes."""
        self.failures += 1
        if self.ok:
            self.ok = False
            self.since = time.monotonic()
            log.error("ledger: %s cannot be made durable (%s: %s); they are kept in memory "
                      "and retried, answers waiting for their record fail after "
                      "store.ledger_timeout, /readyz reports 503 until this recovers",
                      self.what, type(exc).__name__, exc)

    def recovered(self) -> None:
        """Records were made durable; logs only when that ends a failing spell."""
        if not self.ok:
            log.warning("ledger: %s durable again after %d failed attempts over %.1f s",
                        self.what, self.failures, time.monotonic() - self.since)
            self.ok = True
            self.failures = 0
