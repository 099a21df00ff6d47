"""Errors of the ledger; writes never raise them (they spool), reads do::

LedgerError
├── LedgerUnavailable        the store cannot be reached now (reads: retry later)
│   ├── LedgerConnectError   connection refused / reset / cluster down
│   └── LedgerTimeout        no answer within the deadline
└── LedgerStoreError         the store answered with an error (a bug, not an outage)
"""

from __future__ import annotations

__all__ = [
    "LedgerConnectError",
    "LedgerError",
    "LedgerStoreError",
    "LedgerTimeout",
    "LedgerUnavailable",
]


class LedgerError(Exception):
    """Base of every ledger error."""


class LedgerUnavailable(LedgerError):
    """The store could not be reached; nothing was read."""


class LedgerConnectError(LedgerUnavailable):
    """Connecting to (or talking with) the store failed."""


class LedgerTimeout(LedgerUnavailable):
    """The store did not answer within the deadline."""


class LedgerStoreError(LedgerError):
    """The store refused a command (wrong type, script error)."""
