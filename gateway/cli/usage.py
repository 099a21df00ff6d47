"""``gateway usage export|reconcile``: read the ledger of record the policy's store names.

``export`` streams records from the database (keyset chunks of 1,000: memory holds one chunk,
whatever the range) as CSV or JSON Lines with every record column. ``reconcile`` compares, for
each tenant and UTC day, the hourly rollups with the sum of the day's records (both read in
one snapshot) and prints every drifting (tenant, hour, group, counter) with both figures;
days past retention have no records left to compare and are skipped (and said so).

Exit status: 0 done (reconcile: no drift), 1 reconcile found drift, 2 bad arguments, an
unreadable policy, or a database that could not be read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.ledger.sql.store import SqlLedger

__all__ = ["add_usage_parser"]


def _fail(message: str) -> int:
    print(f"gateway usage: {message}", file=sys.stderr)
    return 2


def _day(text: str, flag: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a day (YYYY-MM-DD)") from None


async def _export(ledger: SqlLedger, args: argparse.Namespace) -> int:
    from gateway.ledger.export import stream_csv, stream_jsonl
    from gateway.ledger.window import WindowError, parse_instant

    try:
        start, end = parse_instant(args.from_, "--from"), parse_instant(args.to, "--to")
    except WindowError as exc:
        return _fail(str(exc))
    if end <= start:
        return _fail("--to: must be after --from (the range is [from, to))")
    records = ledger.export(start, end, args.tenant)
    chunks = stream_csv(records) if args.format == "csv" else stream_jsonl(records)
    out = sys.stdout
    async for chunk in chunks:
        out.write(chunk)
    out.flush()
    return 0


async def _reconcile(ledger: SqlLedger, args: argparse.Namespace) -> int:
    today = datetime.now(UTC).date()
    cutoff = today - timedelta(days=ledger.settings.retention_days)
    try:
        if args.day is not None:
            if args.from_ is not None or args.to is not None:
                return _fail("give --day or --from/--to, not both")
            first = _day(args.day, "--day")
            stop = first + timedelta(days=1)
        else:
            first = _day(args.from_, "--from") if args.from_ is not None else cutoff
            stop = (_day(args.to, "--to") if args.to is not None
                    else today + timedelta(days=1))
    except ValueError as exc:
        return _fail(str(exc))
    if stop <= first:
        return _fail("--to: must be after --from (the range is [from, to), in UTC days)")
    if first < cutoff:
        print(f"gateway usage: records of days before {cutoff} are past retention "
              f"(store.usage_retention_days = {ledger.settings.retention_days}): their rollups "
              "are not checked", file=sys.stderr)
        first = cutoff
    tenants = [args.tenant] if args.tenant is not None else await ledger.tenants()
    days = [first + timedelta(days=i) for i in range(max(0, (stop - first).days))]
    drifting = 0
    drifted_days = 0
    for tenant in tenants:
        for day in days:
            drifts = await ledger.drift(tenant, day)
            for drift in drifts:
                print(drift.describe())
            drifting += len(drifts)
            drifted_days += bool(drifts)
    where = f"{len(days)} days x {len(tenants)} tenants"
    if drifting:
        print(f"drift: {drifting} counters differ in {drifted_days} (tenant, day) of {where}")
        return 1
    print(f"consistent: the rollups equal the sum of the records ({where})")
    return 0


async def _run(args: argparse.Namespace) -> int:
    from gateway.app.state import make_ledger
    from gateway.config import PolicyError, load_policy
    from gateway.ledger.errors import LedgerError

    try:
        policy = load_policy(args.config)
    except PolicyError as exc:
        return _fail(str(exc))
    ledger = make_ledger(policy.store)
    try:
        await ledger.start()
    except LedgerError as exc:
        await ledger.close()
        return _fail(f"the ledger database: {exc}")
    try:
        if args.usage_command == "export":
            return await _export(ledger, args)
        return await _reconcile(ledger, args)
    except LedgerError as exc:  # the database went away (or never answered)
        return _fail(f"the ledger database could not be read: {exc}")
    except BrokenPipeError:  # `gateway usage export ... | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0
    finally:
        await ledger.close()


def add_usage_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    usage = sub.add_parser(
        "usage",
        help="export usage records, reconcile rollups with records",
        description="Read the ledger of record of the policy's store (the database of "
        "$GATEWAY_LEDGER_URL, else SQLite at <store.data_dir>/ledger.db).",
    )
    usage_sub = usage.add_subparsers(dest="usage_command", required=True, metavar="ACTION")
    export = usage_sub.add_parser(
        "export", help="stream the records of a time range as CSV or JSON Lines",
        description="Stream the records with from <= time < to, ordered by tenant, time and "
        "request id, read from the database in chunks (memory holds one chunk). CSV has a "
        "header row with every record column (empty cell = none, booleans true/false); "
        "JSON Lines has one record object per line. Exit 2 on bad arguments or an "
        "unreadable database.")
    export.add_argument("--config", required=True, help="policy file or directory")
    export.add_argument("--from", dest="from_", required=True,
                        help="start, ISO date or time (UTC unless a zone is given)")
    export.add_argument("--to", required=True, help="end (exclusive), ISO date or time")
    export.add_argument("--tenant", help="only this tenant (default: every tenant)")
    export.add_argument("--format", choices=("csv", "jsonl"), default="jsonl")
    rec = usage_sub.add_parser(
        "reconcile", help="check the hourly rollups against the sum of the records",
        description="For each tenant and UTC day in [from, to), compare the hourly rollups "
        "with the sum of that day's records and print every drifting (tenant, hour, group, "
        "counter) with both figures. Days past store.usage_retention_days have no records "
        "left and are skipped. Exit 0 when consistent, 1 on drift, 2 on bad arguments or "
        "an unreadable database.")
    rec.add_argument("--config", required=True, help="policy file or directory")
    rec.add_argument("--tenant", help="only this tenant (default: every tenant)")
    rec.add_argument("--from", dest="from_",
                     help="first UTC day, YYYY-MM-DD (default: the oldest retained day)")
    rec.add_argument("--to", help="end UTC day, exclusive, YYYY-MM-DD (default: tomorrow, "
                                  "so today is checked)")
    rec.add_argument("--day", help="one UTC day, YYYY-MM-DD (instead of --from/--to)")
    usage.set_defaults(func=lambda args: asyncio.run(_run(args)))
