"""``gateway usage export|reconcile``: read the usage ledger the policy's store names."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime

__all__ = ["add_usage_parser"]


def _ms(text: str) -> int:
    """An ISO date or time (UTC when no zone) -> unix ms."""
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


async def _run(args: argparse.Namespace) -> int:
    from gateway.app.state import make_ledger
    from gateway.config import PolicyError, load_policy
    from gateway.ledger import stream_csv, stream_jsonl

    try:
        policy = load_policy(args.config)
    except PolicyError as exc:
        print(f"gateway usage: {exc}", file=sys.stderr)
        return 2
    ledger = make_ledger(policy.store)
    await ledger.start()
    try:
        if args.usage_command == "export":
            try:
                start, end = _ms(args.from_), _ms(args.to)
            except ValueError as exc:
                print(f"gateway usage: --from/--to: {exc}", file=sys.stderr)
                return 2
            records = ledger.export(start, end, args.tenant)
            chunks = stream_csv(records) if args.format == "csv" else stream_jsonl(records)
            async for chunk in chunks:
                sys.stdout.write(chunk)
            return 0
        diffs = await ledger.reconcile(args.tenant, args.day)
        for d in diffs:
            print(d)
        print(f"{args.tenant} {args.day}: "
              + ("aggregates equal the sum of the records" if not diffs
                 else f"{len(diffs)} differences"))
        return 0 if not diffs else 1
    finally:
        await ledger.close()


def add_usage_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    usage = sub.add_parser(
        "usage",
        help="export usage records, reconcile aggregates",
        description="Read the usage ledger of the policy's store (the database of "
        "$GATEWAY_LEDGER_URL, else SQLite at <store.data_dir>/ledger.db).",
    )
    usage_sub = usage.add_subparsers(dest="usage_command", required=True, metavar="ACTION")
    export = usage_sub.add_parser("export", help="stream records of a time range")
    export.add_argument("--config", required=True, help="policy file or directory")
    export.add_argument("--from", dest="from_", required=True,
                        help="start, ISO date or time (UTC unless a zone is given)")
    export.add_argument("--to", required=True, help="end (exclusive), ISO date or time")
    export.add_argument("--tenant", help="only this tenant")
    export.add_argument("--format", choices=("csv", "jsonl"), default="jsonl")
    rec = usage_sub.add_parser("reconcile", help="check a day's aggregates against its records")
    rec.add_argument("--config", required=True, help="policy file or directory")
    rec.add_argument("--tenant", required=True)
    rec.add_argument("--day", required=True, help="UTC day, YYYY-MM-DD")
    usage.set_defaults(func=lambda args: asyncio.run(_run(args)))
