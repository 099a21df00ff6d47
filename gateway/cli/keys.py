"""``gateway keys create|list|revoke``: managed API keys, straight against the key store."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

__all__ = ["add_keys_parser"]


async def _run(args: argparse.Namespace) -> int:
    from gateway.auth.manage import (
        KeyAdminError,
        create_key,
        open_keystore,
        parse_expiry,
        parse_limits,
        public_view,
    )
    from gateway.config import PolicyError, load_policy

    try:
        policy = load_policy(args.config)
        store = open_keystore(policy)
    except (PolicyError, KeyAdminError) as exc:
        print(f"gateway keys: {exc}", file=sys.stderr)
        return 2
    try:
        if args.keys_command == "create":
            record, key = await create_key(
                store, policy, args.tenant, name=args.name or "",
                expires=parse_expiry(args.expires), default_class=args.default_class,
                allow_class_header=args.allow_class_header, limits=parse_limits(args.limit),
            )
            print(json.dumps({**public_view(record), "key": key}, indent=2))
            print("Store the key now: it is shown once and only its keyed hash is kept.",
                  file=sys.stderr)
        elif args.keys_command == "list":
            rows = [public_view(r) for r in await store.list(args.tenant)]
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                for r in rows:
                    exp = time.strftime("%Y-%m-%d", time.gmtime(r["expires"])) if r["expires"] \
                        else "never"
                    print(f"{r['id']}  {r['tenant']:<20} {r['state']:<8} expires {exp:<10} "
                          f"{r['name']}")
        else:
            revoked = await store.revoke(args.id)
            if revoked is None:
                print(f"gateway keys: no key with id {args.id!r}", file=sys.stderr)
                return 1
            print(json.dumps(public_view(revoked), indent=2))
    except KeyAdminError as exc:
        print(f"gateway keys: {exc}", file=sys.stderr)
        return 2
    finally:
        await store.aclose()
    return 0


def add_keys_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    keys = sub.add_parser(
        "keys",
        help="create, list and revoke managed API keys",
        description="Managed API keys in the policy's key store (Redis from $GATEWAY_REDIS_URL, "
        "or store.keys_file). Hashes are keyed by the secret in $GATEWAY_KEY_SECRET. A revoked "
        "or expired key stops working within auth.cache_ttl seconds (default 2).",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key (shown once)")
    create.add_argument("--config", required=True, help="policy file or directory")
    create.add_argument("--tenant", required=True, help="tenant the key belongs to")
    create.add_argument("--name", help="a label for people")
    create.add_argument("--expires", help="30d, 12h, 90m, or an ISO 8601 time with zone")
    create.add_argument("--default-class", help="request class of this key's requests")
    create.add_argument("--allow-class-header", action="store_true",
                        help="let this key pick its class with X-Request-Class")
    create.add_argument("--limit", action="append", metavar="NAME=N",
                        help="the key's own limit inside its tenant's (repeatable): rpm, tpm, "
                        "concurrency, tokens_per_day, tokens_per_month")
    listing = keys_sub.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--config", required=True, help="policy file or directory")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.add_argument("--json", action="store_true", help="JSON output")
    revoke = keys_sub.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("--config", required=True, help="policy file or directory")
    revoke.add_argument("id", help="the key id (from create or list)")
    keys.set_defaults(func=lambda args: asyncio.run(_run(args)))
