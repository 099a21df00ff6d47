"""``gateway rollout list|status|pause|resume|promote|abort``: progressive canaries, through a
running gateway's admin API (``/admin/rollouts``) over HTTP.

The gateway is ``--url`` (default ``$GATEWAY_URL``, else http://127.0.0.1:8080); the admin
credential is ``$GATEWAY_ADMIN_TOKEN``, as the gateway reads it. Exit status: 0 done, 1 the
gateway refused (unknown model, an action that does not apply now), 2 it could not be asked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["add_rollout_parser"]

_ACTIONS = ("pause", "resume", "promote", "abort")


def _call(args: argparse.Namespace, method: str, path: str) -> tuple[int, Any]:
    token = os.environ.get("GATEWAY_ADMIN_TOKEN", "")
    request = urllib.request.Request(
        args.url.rstrip("/") + path, method=method,
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"null")
        except ValueError:
            body = None
        return exc.code, body


def _line(row: dict[str, Any]) -> str:
    return (f"{row['model']:<28} {row['version']:<16} {row['phase']:<12} "
            f"step {row['step'] + 1}/{len(row['steps'])} {row['share']:>6g}%  "
            f"{row['in_step_s']:>8.1f}s of {row['hold_s']:g}s")


def _print_status(view: dict[str, Any]) -> None:
    print(_line(view))
    req = view.get("requests", {})
    print(f"  window: canary {req.get('canary', 0)} requests (min {view['min_requests']}), "
          f"baseline {req.get('baseline', 0)}")
    for gate in view.get("gates", []):
        print(f"  gate {gate['name']:<17} {gate['verdict']}")
        for cls, figures in (gate.get("classes") or {}).items():
            shown = ", ".join(f"{k}={v}" for k, v in figures.items() if k != "verdict")
            print(f"    {cls:<12} {figures.get('verdict', ''):<5} {shown}")
    for entry in view.get("history", [])[-5:]:
        print(f"  {entry['at']:.0f} {entry['from']} -> {entry['to']} ({entry['reason']}, "
              f"by {entry['by']})")


def _run(args: argparse.Namespace) -> int:
    command = args.rollout_command
    try:
        if command == "list":
            status, body = _call(args, "GET", "/admin/rollouts")
        else:
            path = "/admin/rollouts/" + urllib.parse.quote(args.model, safe="/")
            if command == "status":
                status, body = _call(args, "GET", path)
            else:
                status, body = _call(args, "POST", f"{path}/{command}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"gateway rollout: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    if status != 200:
        message = (body or {}).get("error", {}).get("message") if isinstance(body, dict) \
            else None
        print(f"gateway rollout: HTTP {status}: {message or body}", file=sys.stderr)
        return 2 if status in (401, 404) and message is None else 1
    if args.json:
        print(json.dumps(body, indent=2))
    elif command == "list":
        for row in body:
            print(_line(row))
        if not body:
            print("no progressive rollouts")
    else:
        _print_status(body)
    return 0


def add_rollout_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rollout = sub.add_parser(
        "rollout",
        help="list, inspect and steer progressive canaries",
        description="Progressive canaries of a running gateway, through its admin API "
        "(credential: $GATEWAY_ADMIN_TOKEN).",
    )
    rollout_sub = rollout.add_subparsers(dest="rollout_command", required=True,
                                         metavar="ACTION")
    parsers = [rollout_sub.add_parser("list", help="every rollout: phase, step, share")]
    status = rollout_sub.add_parser("status", help="one rollout: gates, counts, history")
    status.add_argument("model", help="the public model name")
    parsers.append(status)
    helps = {"pause": "hold the current share (no gate decides)",
             "resume": "decide again, in a fresh window at the same step",
             "promote": "give the canary 100% now", "abort": "give the canary 0% now"}
    for action in _ACTIONS:
        p = rollout_sub.add_parser(action, help=helps[action])
        p.add_argument("model", help="the public model name")
        parsers.append(p)
    for p in parsers:
        p.add_argument("--url", default=os.environ.get("GATEWAY_URL", "http://127.0.0.1:8080"),
                       help="the gateway (default $GATEWAY_URL or http://127.0.0.1:8080)")
        p.add_argument("--json", action="store_true", help="the admin API's JSON answer")
        p.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    rollout.set_defaults(func=_run)
