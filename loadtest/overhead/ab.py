"""A/B of two gateway set-ups on the overhead bench's hop: interleaved runs, ratio of medians.

``python -m loadtest.overhead.ab --a "GATEWAY_METRICS=off GATEWAY_ACCESS_LOG=off" --b ""``
starts the nginx fixture backend once, then starts the gateway (pinned to ``--proxy-cpu``) with
set-up A's environment, measures non-streaming requests/s at ``--connections`` with wrk (on
``--client-cpu``), stops it, does the same for B, and repeats ``--pairs`` times in the order
A B, B A, A B, ... so a drift of the machine's speed hits both sides alike. Each run also reads
the gateway's CPU time from ``/proc`` and reports CPU µs per request.

Why a tool of its own: on a shared 2-core machine two runs of the same set-up differ by 5-15%,
as much as the effects worth measuring (telemetry on vs off, quotas on vs off). One run per side
cannot tell them apart; the median over interleaved pairs can, and the per-pair ratios show the
spread. Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import gateway, nginx, payloads, wrk
from .procs import HOST, ProcessSet, check_endpoint, ensure_tools, free_ports

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "overhead-ab.json"


def _env(spec: str) -> dict[str, str]:
    out = {}
    for word in shlex.split(spec):
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise SystemExit(f"expected NAME=VALUE, got {word!r}")
        out[name] = value
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.overhead.ab", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--a", default="", help="environment of set-up A, 'NAME=VALUE ...'")
    p.add_argument("--b", default="", help="environment of set-up B, 'NAME=VALUE ...'")
    p.add_argument("--a-name", default="A")
    p.add_argument("--b-name", default="B")
    p.add_argument("--quotas", action="store_true",
                   help="give the bench tenant a plan with every limit set (as the overhead "
                   "bench's --quotas)")
    p.add_argument("--pairs", type=int, default=5, help="A/B pairs (5)")
    p.add_argument("--duration", type=int, default=10, help="seconds per run (10)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up seconds per run (2)")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--proxy-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--backend-cpu", default="1")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.pairs < 1 or args.duration < 1:
        p.error("--pairs and --duration must be >= 1")
    return args


def _run_one(args: argparse.Namespace, procs: ProcessSet, workdir: Path, tools: dict[str, str],
             env: dict[str, str], backend_port: int, script: Path, api_key: str,
             label: str) -> dict[str, Any]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the gateway child inherits it
    try:
        (port,) = free_ports(1)
        gw = gateway.start(procs, workdir, template=gateway.default_command(), api_key=api_key,
                           port=port, backend_port=backend_port, cpus=args.proxy_cpu or None,
                           label=label, quotas=args.quotas)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        check_endpoint(port, stream=False, headers=headers)
        url = f"http://{HOST}:{port}/v1/chat/completions"
        cpus = args.client_cpu or None
        if args.warmup:
            wrk.run(tools["wrk"], url, script, connections=args.connections,
                    duration_s=args.warmup, cpus=cpus)
        before = _cpu_seconds(gw.proc.pid)
        result = wrk.run(tools["wrk"], url, script, connections=args.connections,
                         duration_s=args.duration, cpus=cpus)
        cpu = _cpu_seconds(gw.proc.pid) - before
    finally:
        procs.stop(gw)
    requests = max(1, round(result.rps * args.duration))
    return {"rps": result.rps, "p50_ms": result.p50_ms, "errors": result.errors,
            "cpu_us_per_request": cpu / requests * 1e6}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    tools = ensure_tools()
    workdir = Path(tempfile.mkdtemp(prefix="overhead-ab-"))
    procs = ProcessSet()
    sides = {args.a_name: _env(args.a), args.b_name: _env(args.b)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    try:
        bj, bs = free_ports(2)
        ports = nginx.PortPair(bj, bs)
        nginx.start(procs, tools["nginx"], workdir, "backend",
                    nginx.backend_config(workdir, ports, args.backend_cpu or None), ports,
                    args.backend_cpu or None)
        api_key = gateway.new_api_key()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        script = workdir / "non-stream.lua"
        script.write_text(wrk.lua_script(payloads.request_body(stream=False), headers))
        names = list(sides)
        for i in range(args.pairs):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                run = _run_one(args, procs, workdir, tools, sides[name], ports.for_mode(False),
                               script, api_key, f"{name}-{i}")
                runs[name].append(run)
                print(f"[ab] pair {i + 1} {name:>10}: {run['rps']:>8,.0f} req/s  "
                      f"{run['cpu_us_per_request']:6.1f} µs CPU/request", flush=True)
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    a, b = (runs[n] for n in names)
    pair_ratios = [y["rps"] / x["rps"] for x, y in zip(a, b, strict=True)]
    med_a = statistics.median(r["rps"] for r in a)
    med_b = statistics.median(r["rps"] for r in b)
    cpu_a = statistics.median(r["cpu_us_per_request"] for r in a)
    cpu_b = statistics.median(r["cpu_us_per_request"] for r in b)
    summary = {
        "a": {"name": names[0], "env": sides[names[0]], "runs": a, "median_rps": med_a,
              "median_cpu_us": cpu_a},
        "b": {"name": names[1], "env": sides[names[1]], "runs": b, "median_rps": med_b,
              "median_cpu_us": cpu_b},
        "ratio_of_medians": med_b / med_a,
        "ratio_of_means": statistics.mean(r["rps"] for r in b) / statistics.mean(
            r["rps"] for r in a),
        "pair_ratios": pair_ratios,
        "cpu_ratio": cpu_a / cpu_b,
        "loadavg_end": os.getloadavg(),
    }
    print("\n| set-up | median req/s | mean req/s | median CPU µs/request |\n|---|---:|---:|---:|")
    for name, rs, med, cpu in ((names[0], a, med_a, cpu_a), (names[1], b, med_b, cpu_b)):
        print(f"| {name} | {med:,.0f} | {statistics.mean(r['rps'] for r in rs):,.0f} | "
              f"{cpu:.1f} |")
    print(f"\n{names[1]} / {names[0]}: ratio of medians {summary['ratio_of_medians']:.3f}, "
          f"of means {summary['ratio_of_means']:.3f}, by CPU per request "
          f"{summary['cpu_ratio']:.3f}; per pair "
          + ", ".join(f"{r:.3f}" for r in pair_ratios))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
