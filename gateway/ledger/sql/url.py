"""Which ledger store a URL names, and opening it.

``postgresql://user:pass@host:port/db`` (or ``postgres://``): the PostgreSQL store of record.
``sqlite:///abs/path.db`` or ``sqlite:relative/path.db``: the embedded SQLite store. The URL is
read from the environment variable ``store.ledger_url_env`` names (``GATEWAY_LEDGER_URL``), so
a password never sits in a policy file; with none set, the gateway uses SQLite in its data
directory. ``describe`` gives the URL with any password masked, for logs and errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from gateway.ledger.base import LedgerSettings
    from gateway.ledger.sql.store import SqlLedger

__all__ = ["LedgerUrl", "describe", "open_ledger", "parse_ledger_url"]


@dataclass(frozen=True, slots=True)
class LedgerUrl:
    """A parsed ledger URL: the dialect and what the driver takes (a DSN or a file path)."""

    dialect: Literal["postgresql", "sqlite"]
    target: str


def parse_ledger_url(url: str) -> LedgerUrl:
    """Raise ValueError (with the URL masked) for anything but PostgreSQL or SQLite."""
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return LedgerUrl("postgresql", url)
    if scheme == "sqlite":
        rest = url[len("sqlite:"):]
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ValueError("a sqlite ledger URL needs a file: sqlite:///path/to/ledger.db")
        return LedgerUrl("sqlite", path)
    raise ValueError(f"unsupported ledger URL {describe(url)!r}: use postgresql://... or "
                     "sqlite:///path")


def describe(url: str) -> str:
    """The URL with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def open_ledger(
    url: str,
    *,
    spool_dir: str | os.PathLike[str],
    settings: LedgerSettings | None = None,
    migrate: bool = False,
    deadline: float = 2.0,
) -> SqlLedger:
    """The store a URL names (not started). SQLite always migrates its own file; PostgreSQL
    only with ``migrate`` (else ``start`` refuses a schema it does not know)."""
    parsed = parse_ledger_url(url)
    if parsed.dialect == "sqlite":
        from gateway.ledger.sql.sqlite import SqliteLedger

        return SqliteLedger(parsed.target, spool_dir=spool_dir, settings=settings,
                            deadline=deadline)
    from gateway.ledger.sql.postgres import PostgresLedger

    return PostgresLedger(parsed.target, spool_dir=spool_dir, settings=settings,
                          migrate=migrate, deadline=deadline)
