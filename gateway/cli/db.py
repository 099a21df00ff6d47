"""``gateway db migrate|status``: the ledger database's schema, applied and checked.

``migrate`` applies the missing migrations in order (each in its own transaction; replicas
running it at once migrate once). ``status`` prints the version the database is at and the
one this gateway needs, and exits 1 when they differ, so a deploy step can gate on it.
``check_ledger_schema`` is what ``gateway serve`` runs before it binds: a gateway refuses to
start against a schema it does not know, with the message of ``migrations.verdict``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config.model import Policy
    from gateway.ledger.sql.store import SqlLedger

__all__ = ["add_db_parser", "check_ledger_schema"]


def _open(policy: Policy) -> tuple[SqlLedger, str]:
    from gateway.app.state import ledger_url

    return _open_url(ledger_url(policy.store), policy.store.spool_dir)


def _open_url(url: str, spool_dir: str) -> tuple[SqlLedger, str]:
    from gateway.ledger.sql import open_ledger
    from gateway.ledger.sql.url import describe

    return open_ledger(url, spool_dir=spool_dir), describe(url)


async def _status(ledger: SqlLedger, where: str) -> tuple[int, str]:
    from gateway.ledger.sql import SCHEMA_VERSION
    from gateway.ledger.sql.migrations import verdict

    try:
        applied = await ledger.applied_version()
    finally:
        await ledger.close()
    problem = verdict(applied)
    line = f"{where}: schema version {applied}, this gateway needs {SCHEMA_VERSION}"
    return (0, line) if problem is None else (1, f"{line}\n{problem}")


async def _migrate(ledger: SqlLedger, where: str) -> tuple[int, str]:
    from gateway.ledger.sql import SCHEMA_VERSION

    try:
        done = await ledger.migrate()
    finally:
        await ledger.close()
    if not done:
        return 0, f"{where}: already at schema version {SCHEMA_VERSION}"
    return 0, f"{where}: applied migrations {', '.join(map(str, done))}; now at {SCHEMA_VERSION}"


def check_ledger_schema(policy: Policy) -> str | None:
    """None when the ledger database is usable (or unreachable: its records spool until it
    answers), else why the gateway must not start. SQLite migrates its own file; so does
    PostgreSQL with ``store.ledger_migrate``."""
    from gateway.ledger import LedgerUnavailable
    from gateway.ledger.sql.migrations import verdict

    ledger, where = _open(policy)
    if ledger.dialect == "sqlite" or policy.store.ledger_migrate:
        return None

    async def check() -> str | None:
        try:
            applied = await ledger.applied_version()
        except LedgerUnavailable:
            return None
        finally:
            await ledger.close()
        problem = verdict(applied)
        return None if problem is None else f"{where}: {problem}"

    return asyncio.run(check())


def _run(args: argparse.Namespace) -> int:
    from gateway.config import PolicyError, load_policy
    from gateway.ledger import LedgerError

    action = _migrate if args.db_command == "migrate" else _status
    try:
        if args.url:
            ledger, where = _open_url(args.url, tempfile.mkdtemp(prefix="gateway-db-"))
        elif args.config:
            ledger, where = _open(load_policy(args.config))
        else:
            print("gateway db: give --config (the gateway's policy) or --url", file=sys.stderr)
            return 2
        code, text = asyncio.run(action(ledger, where))
    except PolicyError as exc:
        print(f"gateway db: invalid policy: {exc}", file=sys.stderr)
        return 2
    except (LedgerError, OSError, ValueError) as exc:
        print(f"gateway db: {exc}", file=sys.stderr)
        return 2
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


def add_db_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = sub.add_parser(
        "db",
        help="migrate or check the ledger database",
        description="The ledger database named by $GATEWAY_LEDGER_URL (store.ledger_url_env: "
        "postgresql://... or sqlite:///path), else SQLite at <store.data_dir>/ledger.db.",
    )
    actions = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    migrate = actions.add_parser("migrate", help="apply the missing schema migrations")
    status = actions.add_parser(
        "status", help="print the schema version (exit 1 if not this gateway's)")
    for action in (migrate, status):
        action.add_argument("--config", help="the gateway's policy file or directory (its "
                            "store names the database)")
        action.add_argument("--url", help="the database URL instead (postgresql://... or "
                            "sqlite:///path); a password in it is never printed")
    db.set_defaults(func=_run)
