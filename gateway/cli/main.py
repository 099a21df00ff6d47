"""The ``gateway`` command: serve, check, sim, demo, schema, keys, usage, db, rollout."""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main"]


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway.cli.serve import serve
    from gateway.config import PolicyError

    try:
        serve(args.config, args.host, args.port, args.workers)
    except PolicyError as exc:
        print(f"gateway: invalid policy: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from gateway.config import PolicyError, load_policy

    try:
        policy = load_policy(args.config)
    except PolicyError as exc:
        print(f"gateway: invalid policy: {exc}", file=sys.stderr)
        return 2
    backends = sum(len(p.backends) for p in policy.pools)
    print(
        f"{args.config}: ok ({len(policy.pools)} pools, {backends} backends,"
        f" {len(policy.models)} models, {len(policy.auth.keys)} keys)"
    )
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from gateway.config.schema import policy_schema_json

    text = policy_schema_json()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from gateway.sim.cli import main as sim_main

    return sim_main(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from gateway.cli.demo import run_demo

    return run_demo(args.host, args.port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="An OpenAI-compatible LLM inference gateway.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="serve the gateway",
        description="Serve the gateway for a policy file or directory. SIGTERM drains in-flight "
        "requests for up to server.drain_timeout seconds before stopping. SIGHUP to a worker, "
        "or POST /admin/reload, reloads the policy in every worker.",
    )
    serve.add_argument("--config", required=True, help="policy YAML file or directory of them")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port to bind (default 8080)")
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes sharing the port (default 1)"
    )
    serve.set_defaults(func=_cmd_serve)

    check = sub.add_parser(
        "check",
        help="validate a policy without serving",
        description="Validate a policy; print what is wrong (file, field, problem); exit 2 if bad.",
    )
    check.add_argument("--config", required=True, help="policy YAML file or directory of them")
    check.set_defaults(func=_cmd_check)

    schema = sub.add_parser(
        "schema",
        help="print the policy JSON Schema",
        description="Print the JSON Schema of policy files (published as policies/schema.json).",
    )
    schema.add_argument("--output", "-o", help="write to this file instead of stdout")
    schema.set_defaults(func=_cmd_schema)

    sim = sub.add_parser(
        "sim",
        help="run a simulated inference engine",
        description="Run an OpenAI-compatible simulated continuous-batching inference engine "
        "(for demos, tests and load tests).",
    )
    from gateway.sim.cli import add_arguments

    add_arguments(sim)
    sim.set_defaults(func=_cmd_sim)

    from gateway.cli.keys import add_keys_parser

    add_keys_parser(sub)
    from gateway.cli.usage import add_usage_parser

    add_usage_parser(sub)
    from gateway.cli.db import add_db_parser

    add_db_parser(sub)
    from gateway.cli.rollout import add_rollout_parser

    add_rollout_parser(sub)

    demo = sub.add_parser(
        "demo",
        help="run the gateway with simulated pools on embedded defaults",
        description="Start an interactive and a batch simulated pool and the gateway in front of "
        "them (no Redis, no config), print the URL, a demo key and examples. Ctrl-C, SIGTERM or "
        "SIGHUP stops it; the simulators always stop with it (even on SIGKILL).",
    )
    demo.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
