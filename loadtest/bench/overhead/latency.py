"""Added latency at one connection, everything on: ``python -m loadtest.bench.overhead.latency``.

One command, one run: the nginx fixture backend, the nginx hop, a redis-server and a PostgreSQL
(migrated), and gateways side by side on the proxy core, each a set-up:

- ``embedded``: quotas (every limit set) in the gateway's memory, the default SQLite ledger
  with ``ledger_durability: buffered``, metrics, the access log and tracing at the default 1 %
  to the fixture's live OTLP sink; no server of its own;
- ``all-on``: the same with the quotas reserved and settled in Redis and the ledger in
  PostgreSQL, buffered (the headline);
- ``all-on-commit``: ``all-on`` with ``ledger_durability: commit`` (a response's last bytes
  wait for its record's commit in the database);
- ``all-on-journal``: ``all-on`` with ``ledger_durability: journal`` (the last bytes wait for
  the record's fsync to the local journal; the database gets it in the background);
- ``all-on-process``: ``all-on`` with ``ledger_durability: process``, what the default
  (``auto``) is on a local disk (the last bytes wait for the record's write to the local
  journal, its fsync follows in the background);
- ``all-on-stages`` (unless ``--no-stages``): ``all-on`` under ``loadtest.bench.overhead.stages``,
  which times each stage of every request; its table is the profile, its p50 shows what the
  timing added;
- ``baseline`` (``--baseline-tree PATH``): ``all-on`` running another tree's code (before/after
  in the same run), and ``baseline-stages``, that tree's gateway under the same stage timer.

wrk then measures each at one connection (``--connections``) in short windows, every target
once per round, the order rotated each round (``direct``, the hop and the gateways see the same
machine within a round), the others idle. Reported per target: the median over rounds of the
window p50 and p99, and of the per-round differences to the nginx hop (added p50/p99 against
the hop of the same round) and to ``direct``; the stage table; the load average. It reuses the
A/B tool's servers and gateway start (``ab.py``) and the main tool's wrk and nginx plumbing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import ab, gateway, nginx, payloads, stages, wrk
from .procs import HOST, ProcessSet, check_endpoint, ensure_tools, free_ports

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "results" / "overhead-latency.json"
ALL_ON = {"GATEWAY_REDIS_URL": "{redis_url}", "GATEWAY_LEDGER_URL": "{postgres_url}",
          "OTEL_TRACES_EXPORTER": "otlp"}
BUFFERED = {"ledger_durability": "buffered"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.overhead.latency",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10, help="windows per target (10)")
    p.add_argument("--duration", type=int, default=2, help="seconds per window (2)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up seconds per target (2)")
    p.add_argument("--connections", type=int, default=1, help="wrk connections (1)")
    p.add_argument("--baseline-tree", type=Path, default=None,
                   help="also run all-on from this tree (PYTHONPATH), e.g. an export of main")
    p.add_argument("--no-commit", action="store_true", help="skip the all-on-commit set-up")
    p.add_argument("--no-journal", action="store_true", help="skip the all-on-journal set-up")
    p.add_argument("--no-process", action="store_true", help="skip the all-on-process set-up")
    p.add_argument("--no-stages", action="store_true", help="skip the profiled set-up")
    p.add_argument("--no-embedded", action="store_true", help="skip the embedded set-up")
    p.add_argument("--proxy-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--backend-cpu", default="1",
                   help="taskset CPU list of the backend, PostgreSQL and (by default) Redis")
    p.add_argument("--redis-cpu", default=None,
                   help="taskset CPU list of the redis-server (default: --backend-cpu); "
                   "the proxy's core shows what the reserve's cross-core wake-ups cost")
    gateway.add_log_sink_option(p)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.duration < 1:
        p.error("--rounds and --duration must be >= 1")
    # what ab._start and ab._start_servers read
    args.redis = args.postgres = args.quotas = True
    args.stream, args.no_store = False, False
    return args


def setups(args: argparse.Namespace, workdir: Path) -> dict[str, dict[str, Any]]:
    """Each gateway set-up: its environment, ``store:`` options and command."""
    out: dict[str, dict[str, Any]] = {}
    if not args.no_embedded:
        out["embedded"] = {"env": {"OTEL_TRACES_EXPORTER": "otlp"}, "store": BUFFERED}
    out["all-on"] = {"env": ALL_ON, "store": BUFFERED}
    if not args.no_commit:
        out["all-on-commit"] = {"env": ALL_ON, "store": {"ledger_durability": "commit"}}
    if not args.no_journal:
        out["all-on-journal"] = {"env": ALL_ON, "store": {"ledger_durability": "journal"}}
    if not args.no_process:  # the default (``auto``) on a local disk
        out["all-on-process"] = {"env": ALL_ON, "store": {"ledger_durability": "process"}}
    tree = Path(__file__).resolve().parents[3]
    if not args.no_stages:
        out["all-on-stages"] = _staged(workdir, "all-on-stages", tree)
    if args.baseline_tree is not None:
        baseline = args.baseline_tree.resolve()
        out["baseline"] = {"env": {**ALL_ON, "PYTHONPATH": str(baseline)}, "store": BUFFERED}
        if not args.no_stages:
            out["baseline-stages"] = _staged(workdir, "baseline-stages", baseline)
    return out


def _staged(workdir: Path, name: str, tree: Path) -> dict[str, Any]:
    """``all-on`` with ``tree``'s gateway under the stage timer (run as a script, so that
    another tree's gateway can be timed by this tree's ``stages.py``)."""
    template = (f"{sys.executable} {Path(stages.__file__).resolve()} serve --config {{config}}"
                " --host {host} --port {port} --workers 1")
    return {"env": {**ALL_ON, stages.ENV_OUT: str(workdir / f"{name}.json"),
                    "PYTHONPATH": str(tree)},
            "store": BUFFERED, "template": template}


def _evalsha_stats(url: str) -> dict[str, float]:
    """Redis's own time in the quota scripts (``INFO commandstats``): reserves and settles of
    every set-up together, warm-up included."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
    finally:
        client.close()
    return {"calls": float(stats.get("calls", 0)),
            "usec_per_call": float(stats.get("usec_per_call", 0.0))}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(windows: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per target: median window p50/p99 (ms), and the medians of the per-round differences to
    the hop and to direct (the same round's windows)."""
    hop, direct = windows["nginx hop"], windows["direct"]
    out = {}
    for name, runs in windows.items():
        row = {"p50_ms": _median([r["p50_ms"] for r in runs]),
               "p99_ms": _median([r["p99_ms"] for r in runs]),
               "rps": _median([r["rps"] for r in runs])}
        pairs = list(zip(runs, hop, direct, strict=True))
        row["added_p50_vs_hop_ms"] = _median([r["p50_ms"] - h["p50_ms"] for r, h, _ in pairs])
        row["added_p99_vs_hop_ms"] = _median([r["p99_ms"] - h["p99_ms"] for r, h, _ in pairs])
        row["added_p50_vs_direct_ms"] = _median([r["p50_ms"] - d["p50_ms"]
                                                 for r, _, d in pairs])
        out[name] = row
    return out


def report(summary: dict[str, dict[str, float]], profiles: dict[str, dict[str, Any]],
           meta: dict[str, Any]) -> str:
    lines = ["", f"One connection, {meta['rounds']} rounds of {meta['duration_s']} s per target "
             f"(load average {meta['loadavg_start'][0]:.2f} at the start, "
             f"{meta['loadavg_end'][0]:.2f} at the end)", "",
             f"Redis's own time per quota script call (reserves and settles together): "
             f"{meta['redis_evalsha'].get('usec_per_call', 0):.1f} µs over "
             f"{meta['redis_evalsha'].get('calls', 0):,.0f} calls", "",
             "| target | req/s | p50 ms | p99 ms | added p50 vs hop | added p99 vs hop "
             "| added p50 vs direct |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in summary.items():
        lines.append(f"| {name} | {r['rps']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{r['added_p50_vs_hop_ms']:+.3f} | {r['added_p99_vs_hop_ms']:+.3f} | "
                     f"{r['added_p50_vs_direct_ms']:+.3f} |")
    if profiles:
        names = list(profiles)
        lines += ["", "Stages (median µs per request; each median apart, so they do not add up "
                  "to the total's exactly): " + ", ".join(
                      f"{n} over {profiles[n]['requests']:,} requests" for n in names), "",
                  "| stage | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        rows = (*stages.PATH_STAGES, "total", *stages.RESERVE_PARTS, *stages.AFTER_STAGES,
                "settle on the wire")
        for stage in rows:
            cells = []
            for n in names:
                value = profiles[n].get(stage)
                cells.append("-" if value is None else f"{value:,.1f}" if isinstance(
                    value, float) else f"{value:,}")
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
        lines += ["", "reserve parts: its encode and the loop until its write; the wire and "
                  "Redis; the reply's decode and the wake-up. After the last bytes: telemetry, "
                  "settle (background, to its reply). settle on the wire: reserves written "
                  "while a settle was unanswered (count)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    tools = ensure_tools()
    workdir = Path(tempfile.mkdtemp(prefix="overhead-latency-"))
    procs = ProcessSet()
    stack = contextlib.ExitStack()
    loadavg_start = os.getloadavg()
    windows: dict[str, list[dict[str, float]]] = {}
    profiles: dict[str, dict[str, Any]] = {}
    redis_stats: dict[str, float] = {}
    try:
        urls = ab._start_servers(args, stack)
        backend = nginx.PortPair(*free_ports(2))
        nginx.start(procs, tools["nginx"], workdir, "backend",
                    nginx.backend_config(workdir, backend, args.backend_cpu or None), backend,
                    args.backend_cpu or None)
        _, hop = nginx.start_hop(procs, tools["nginx"], workdir, backend, args.proxy_cpu or None)
        api_key = gateway.new_api_key()
        headers = payloads.request_headers(api_key, "chat")
        script = workdir / "non-stream.lua"
        script.write_text(wrk.lua_script(payloads.request_body(stream=False), headers))
        ports = {"direct": backend.json, "nginx hop": hop.json}
        for port in ports.values():
            check_endpoint(port, stream=False, headers=headers)
        for name, setup in setups(args, workdir).items():
            env = ab._filled(setup["env"], urls)
            env.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{HOST}:{backend.json}")
            print(f"[latency] starting {name}", flush=True)
            _, ports[name] = ab._start(args, procs, workdir, env, backend.json, api_key, name,
                                       "chat", setup["store"] or None,
                                       template=setup.get("template"))
        names = list(ports)
        windows = {name: [] for name in names}

        def window(name: str, seconds: int) -> dict[str, float]:
            url = f"http://{HOST}:{ports[name]}/v1/chat/completions"
            result = wrk.run(tools["wrk"], url, script, connections=args.connections,
                             duration_s=seconds, cpus=args.client_cpu or None)
            if result.error_count:
                raise RuntimeError(f"{name}: {result.error_count} failed requests "
                                   f"({result.errors})")
            return {"p50_ms": result.p50_ms, "p99_ms": result.p99_ms, "rps": result.rps}

        if args.warmup:
            for name in names:
                window(name, args.warmup)
        for i in range(args.rounds):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                run = window(name, args.duration)
                windows[name].append(run)
                print(f"[latency] round {i + 1:>2} {name:>14}: p50 {run['p50_ms']:.3f} ms  "
                      f"p99 {run['p99_ms']:.3f} ms", flush=True)
        redis_stats = _evalsha_stats(urls["redis_url"])
        profiles = {}
        for managed in list(procs.procs):  # a timed gateway writes its figures as it exits
            name = managed.name.removeprefix("gateway-")
            if name.endswith("-stages"):
                procs.stop(managed)
                if (workdir / f"{name}.json").exists():
                    profiles[name] = json.loads((workdir / f"{name}.json").read_text())
    finally:
        procs.stop_all()
        stack.close()
        shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(windows)
    meta = {"redis_evalsha": redis_stats, "rounds": args.rounds, "duration_s": args.duration,
            "connections": args.connections,
            "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg(),
            "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None}
    print(report(summary, profiles, meta))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "summary": summary, "windows": windows,
                                    "stages": profiles}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
