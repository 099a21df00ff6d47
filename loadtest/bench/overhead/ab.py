"""A/B of two gateway set-ups on the overhead bench's hop: interleaved runs, ratio of medians.

``python -m loadtest.bench.overhead.ab --a "GATEWAY_METRICS=off GATEWAY_ACCESS_LOG=off" --b ""``
starts the nginx fixture backend, then two gateways side by side, both pinned to
``--proxy-cpu``: one with set-up A's environment, one with B's. It then measures non-streaming
requests/s at ``--connections`` with wrk (on ``--client-cpu``) against each in turn, in short
windows (``--duration`` seconds), ``--pairs`` times in the order A B, B A, A B, ... The gateway
not under load sits idle. Each window also reads the loaded gateway's CPU time from ``/proc``.

Why a tool of its own: on this shared 2-core machine the speed of a core drifts by up to 1.8x
over a minute (the same set-up measured 9,184 and 5,182 requests/s three minutes apart), far
more than the effects worth measuring (telemetry on vs off, quotas on vs off). Separate runs per
side cannot tell them apart; windows of a few seconds on two live processes, alternated, see the
same machine. Both gateways get ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at the fixture
backend's OTLP sink (``/v1/traces``, answered 200) unless their set-up names one, so
``--b OTEL_TRACES_EXPORTER=otlp`` exports spans to a live collector. Reported: the ratio of
the summed requests (B/A) over all windows, the median of the per-pair ratios and their
spread. Prints a table and writes JSON (``--out``).

The two sides may also differ by the client API: ``--a-api chat --b-api messages`` sends side
B the same request as an Anthropic Messages request (``responses``: an OpenAI Responses
request), which the gateway translates to chat completions for the chat-only fixture backend
and back; each side's answer is checked in its own API first. ``--stream`` measures streams
of 64 chunks instead of whole answers. The CPU per request (and per chunk, for streams) of
each side, and the per-pair ratios of it (B/A) with their quartiles, are the cost of the
translation on the same build, same run.

The two sides may also differ by their stores. ``--redis`` starts a redis-server and
``--postgres`` a PostgreSQL (``pgserver``, migrated with this tree's migrations), both pinned to
``--backend-cpu``; their URLs replace ``{redis_url}`` and ``{postgres_url}`` in ``--a``/``--b``.
``--a-store``/``--b-store`` ``"name=value ..."`` add ``store:`` options to that side's policy
(``ledger_durability=buffered``); ``--a-workers``/``--b-workers`` its worker processes (the CPU
of a side is summed over the gateway's process tree). A side's environment may name another tree
(``PYTHONPATH=/work/wt/old``): the Redis ledger against the PostgreSQL one is

    --redis --postgres --a "PYTHONPATH=<tree with the Redis ledger> GATEWAY_REDIS_URL={redis_url}"
    --b "GATEWAY_LEDGER_URL={postgres_url} GATEWAY_REDIS_URL={redis_url}"
"""

from __future__ import annotations

import argparse
import contextlib
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
from .procs import HOST, Managed, ProcessSet, check_endpoint, ensure_tools, free_ports

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "results" / "overhead-ab.json"


def _env(spec: str) -> dict[str, str]:
    out = {}
    for word in shlex.split(spec):
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise SystemExit(f"expected NAME=VALUE, got {word!r}")
        out[name] = value
    return out


def _filled(env: dict[str, str], urls: dict[str, str]) -> dict[str, str]:
    """``env`` with ``{redis_url}`` / ``{postgres_url}`` replaced by the servers' URLs."""
    out = {}
    for name, value in env.items():
        for field, url in urls.items():
            value = value.replace("{" + field + "}", url)
        if "{redis_url}" in value or "{postgres_url}" in value:
            raise SystemExit(f"{name}={value}: start the server with --redis / --postgres")
        out[name] = value
    return out


def _pin(pid: int, cpus: str | None) -> None:
    """Pin a server (and the processes it forks from now on) to ``cpus`` ("1", "0,1")."""
    if cpus:
        os.sched_setaffinity(pid, {int(c) for c in cpus.split(",")})


def _start_servers(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, str]:
    """The ``--redis`` / ``--postgres`` servers of the run; their URLs by field name."""
    urls: dict[str, str] = {}
    if args.redis:
        from loadtest.bench.redis_local import redis_server

        urls["redis_url"] = stack.enter_context(redis_server())
        port = int(urls["redis_url"].rsplit(":", 1)[1])
        for proc in Path("/proc").iterdir():  # the redis-server just started, by its port
            with contextlib.suppress(OSError, ValueError):
                if f"--port\0{port}\0" in (proc / "cmdline").read_text():
                    _pin(int(proc.name), getattr(args, "redis_cpu", None) or args.backend_cpu
                         or None)
    if args.postgres:
        import asyncio

        from gateway.ledger.sql.postgres import PostgresLedger
        from loadtest.bench.pgserver import PostgresServer

        server = stack.enter_context(PostgresServer().start())
        assert server.proc is not None
        _pin(server.proc.pid, args.backend_cpu or None)
        urls["postgres_url"] = server.url

        async def migrate() -> list[int]:
            spool = Path(tempfile.mkdtemp(prefix="ab-migrate-"))
            ledger = PostgresLedger(server.url, spool_dir=spool)
            try:
                return await ledger.migrate()
            finally:
                await ledger.close()
                shutil.rmtree(spool, ignore_errors=True)

        print(f"[ab] postgresql {server.url}: migrations {asyncio.run(migrate())}", flush=True)
    return urls


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a gateway with ``--workers N`` forks its workers)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return found


#: the label of the nginx hop's windows (``--hop``)
HOP = "nginx hop"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of the gateway's processes (its workers included)."""
    ticks = 0
    for member in _tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _kernel_counts(pid: int) -> dict[str, int]:
    """The gateway's processes' read/write system calls (``/proc/PID/io``: ``syscr`` +
    ``syscw``; epoll waits are not among them) and context switches, voluntary (it blocked)
    and not (it was preempted): what per-request CPU alone does not say, such as whether two
    workers on one core batch less or hand the core over more often than one."""
    out = {"syscalls": 0, "voluntary": 0, "involuntary": 0}  # io: the whole process
    for member in _tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/io").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("syscr", "syscw"):
                    out["syscalls"] += int(value)
        for task in Path(f"/proc/{member}/task").glob("*/status"):  # per thread
            with contextlib.suppress(OSError):
                for line in task.read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key == "voluntary_ctxt_switches":
                        out["voluntary"] += int(value)
                    elif key == "nonvoluntary_ctxt_switches":
                        out["involuntary"] += int(value)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.overhead.ab",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--a", default="", help="environment of set-up A, 'NAME=VALUE ...'")
    p.add_argument("--b", default="", help="environment of set-up B, 'NAME=VALUE ...'")
    p.add_argument("--a-name", default=None, help="label of A (default: its API if the "
                   "sides' APIs differ, else 'A')")
    p.add_argument("--b-name", default=None)
    p.add_argument("--a-api", choices=sorted(payloads.API_PATHS), default="chat",
                   help="the API set-up A's client speaks (chat)")
    p.add_argument("--b-api", choices=sorted(payloads.API_PATHS), default="chat",
                   help="the API set-up B's client speaks (chat); the backend speaks chat only")
    p.add_argument("--a-store", default="", help="store: options of A's policy, "
                   "'name=value ...' (ledger_durability=buffered)")
    p.add_argument("--b-store", default="", help="store: options of B's policy")
    p.add_argument("--redis", action="store_true",
                   help="start a redis-server; its URL fills {redis_url} in --a/--b")
    p.add_argument("--postgres", action="store_true",
                   help="start a PostgreSQL (migrated); its URL fills {postgres_url} in --a/--b")
    p.add_argument("--stream", action="store_true",
                   help="streamed requests (64 chunks each) instead of whole answers")
    p.add_argument("--no-store", action="store_true",
                   help="Responses requests with store: false (translation alone, without "
                   "saving the response)")
    p.add_argument("--a-workers", type=int, default=1,
                   help="worker processes of A's gateway (`gateway serve --workers`; 1)")
    p.add_argument("--b-workers", type=int, default=1, help="worker processes of B's gateway")
    p.add_argument("--hop", action="store_true",
                   help="also measure the nginx hop (a plain reverse proxy on --proxy-cpu) in "
                   "a window of each pair, chat API: the floor of the same run")
    p.add_argument("--quotas", action="store_true",
                   help="give the bench tenant a plan with every limit set (as the overhead "
                   "bench's --quotas)")
    p.add_argument("--pairs", type=int, default=20, help="A/B window pairs (20)")
    p.add_argument("--duration", type=int, default=3, help="seconds per window (3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up seconds per gateway (2)")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--b-connections", type=int, default=None,
                   help="B's connections, if not --connections (e.g. twice as many for twice "
                   "the workers: the same concurrency per worker)")
    p.add_argument("--proxy-cpu", default="0")
    p.add_argument("--b-proxy-cpu", default=None,
                   help="B's gateway on these CPUs instead of --proxy-cpu (\"0,1\": B's "
                   "workers free to spread over both cores, sharing the second with the "
                   "client and backend)")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--backend-cpu", default="1")
    gateway.add_log_sink_option(p)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.pairs < 1 or args.duration < 1:
        p.error("--pairs and --duration must be >= 1")
    differ = args.a_api != args.b_api
    args.a_name = args.a_name or (args.a_api if differ else "A")
    args.b_name = args.b_name or (args.b_api if differ else "B")
    if args.a_name == args.b_name:
        p.error("the two set-ups need different names (--a-name, --b-name)")
    return args


def _start(args: argparse.Namespace, procs: ProcessSet, workdir: Path, env: dict[str, str],
           backend_port: int, api_key: str, label: str, api: str,
           store: dict[str, str] | None = None, workers: int = 1,
           template: str | None = None, cpus: str | None = None) -> tuple[Any, int]:
    """Start one set-up's gateway (``template``: its command, ``gateway serve`` by default)
    with ``env`` added to this process's environment; check it answers."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the gateway child inherits it
    try:
        (port,) = free_ports(1)
        template = (template or gateway.default_command()).replace(
            "--workers 1", f"--workers {workers}")
        gw = gateway.start(procs, workdir, template=template, api_key=api_key,
                           port=port, backend_port=backend_port,
                           cpus=cpus or args.proxy_cpu or None,
                           label=label, quotas=args.quotas, store=store,
                           log_shim=args.log_sink == "pipe", log_shim_cpus=args.client_cpu or None)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    check_endpoint(port, stream=args.stream, headers=payloads.request_headers(api_key, api),
                   api=api, store=not args.no_store)
    return gw, port


def _window(args: argparse.Namespace, tools: dict[str, str], gw: Any, port: int, api: str,
            script: Path, duration: int, connections: int | None = None) -> dict[str, Any]:
    url = f"http://{HOST}:{port}{payloads.API_PATHS[api]}"
    before, counts = _cpu_seconds(gw.proc.pid), _kernel_counts(gw.proc.pid)
    result = wrk.run(tools["wrk"], url, script, connections=connections or args.connections,
                     duration_s=duration, cpus=args.client_cpu or None)
    cpu = _cpu_seconds(gw.proc.pid) - before
    kernel = {k: v - counts[k] for k, v in _kernel_counts(gw.proc.pid).items()}
    if result.error_count:  # an error answer is cheap: it would pass for a fast request
        raise RuntimeError(f"{gw.name}: {result.error_count} failed requests in a window "
                           f"({result.errors}); see {gw.log}")
    requests = max(1, result.requests)
    return {"rps": result.rps, "requests": requests, "p50_ms": result.p50_ms,
            "errors": result.errors, "cpu_s": cpu, "cpu_us_per_request": cpu / requests * 1e6,
            **kernel}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """First quartile, median, third quartile (one value: that value three times)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    tools = ensure_tools()
    workdir = Path(tempfile.mkdtemp(prefix="overhead-ab-"))
    procs = ProcessSet()
    stack = contextlib.ExitStack()
    urls = _start_servers(args, stack)
    sides = {args.a_name: _filled(_env(args.a), urls), args.b_name: _filled(_env(args.b), urls)}
    stores = {args.a_name: _env(args.a_store), args.b_name: _env(args.b_store)}
    apis = {args.a_name: args.a_api, args.b_name: args.b_api}
    workers = {args.a_name: args.a_workers, args.b_name: args.b_workers}
    proxy_cpus = {args.a_name: args.proxy_cpu, args.b_name: args.b_proxy_cpu or args.proxy_cpu}
    conns = {args.a_name: args.connections, args.b_name: args.b_connections or args.connections}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    hops: list[dict[str, Any]] = []
    idle = dict.fromkeys(sides, 0.0)  # CPU seconds of each side while the other was loaded
    try:
        bj, bs = free_ports(2)
        ports = nginx.PortPair(bj, bs)
        nginx.start(procs, tools["nginx"], workdir, "backend",
                    nginx.backend_config(workdir, ports, args.backend_cpu or None), ports,
                    args.backend_cpu or None)
        api_key = gateway.new_api_key()
        mode = "stream" if args.stream else "non-stream"
        scripts = {}
        for name, api in apis.items():
            scripts[name] = workdir / f"{mode}-{api}.lua"
            scripts[name].write_text(wrk.lua_script(
                payloads.request_body(stream=args.stream, api=api, store=not args.no_store),
                payloads.request_headers(api_key, api)))
        hop: tuple[Managed, int] | None = None
        if args.hop:
            proxy, hop_ports = nginx.start_hop(procs, tools["nginx"], workdir, ports,
                                               args.proxy_cpu or None)
            hop = (proxy, hop_ports.for_mode(args.stream))
            scripts[HOP] = workdir / f"{mode}-hop.lua"
            scripts[HOP].write_text(wrk.lua_script(
                payloads.request_body(stream=args.stream, api="chat"),
                payloads.request_headers(api_key, "chat")))
        for env in sides.values():  # a live OTLP sink unless a side names another endpoint
            env.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{HOST}:{ports.json}")
        names = list(sides)
        live = {name: _start(args, procs, workdir, sides[name], ports.for_mode(args.stream),
                             api_key, name, apis[name], stores[name] or None, workers[name],
                             cpus=proxy_cpus[name])
                for name in names}
        if args.warmup:
            for name in names:
                _window(args, tools, *live[name], apis[name], scripts[name], args.warmup,
                        conns[name])
        for i in range(args.pairs):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                other = next(n for n in names if n != name)
                idle_before = _cpu_seconds(live[other][0].proc.pid)
                run = _window(args, tools, *live[name], apis[name], scripts[name],
                              args.duration, conns[name])
                # the side not under load meanwhile: its background work (timers, probes)
                idle[other] += _cpu_seconds(live[other][0].proc.pid) - idle_before
                runs[name].append(run)
                print(f"[ab] pair {i + 1:>2} {name:>12}: {run['rps']:>8,.0f} req/s  "
                      f"{run['cpu_us_per_request']:6.1f} µs CPU/request", flush=True)
            if hop is not None:
                run = _window(args, tools, *hop, "chat", scripts[HOP], args.duration)
                hops.append(run)
                print(f"[ab] pair {i + 1:>2} {HOP:>12}: {run['rps']:>8,.0f} req/s  "
                      f"{run['cpu_us_per_request']:6.1f} µs CPU/request", flush=True)
    finally:
        procs.stop_all()
        stack.close()
        shutil.rmtree(workdir, ignore_errors=True)
    a, b = (runs[n] for n in names)
    summary = summarize(names, sides, apis, a, b, window_s=args.duration, stream=args.stream)
    summary["stores"] = stores
    summary["workers"] = workers
    summary["proxy_cpus"] = proxy_cpus
    for name in names:  # CPU per second of the side while idle (the other side's windows)
        summary["a" if name == names[0] else "b"]["idle_cpu_per_s"] = (
            idle[name] / (args.duration * args.pairs))
    if hops:
        requests = sum(r["requests"] for r in hops)
        summary["hop"] = {"name": HOP, "runs": hops,
                          "rps": requests / (args.duration * len(hops)),
                          "cpu_us_per_request": sum(r["cpu_s"] for r in hops) / requests * 1e6}
    print(report(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def summarize(names: list[str], sides: dict[str, dict[str, str]], apis: dict[str, str],
              a: list[dict[str, Any]], b: list[dict[str, Any]], *, window_s: int,
              stream: bool) -> dict[str, Any]:
    """The run's figures: throughput and CPU per request of each side over all windows, and
    the per-pair ratios B/A (requests/s, CPU per request) with their quartiles."""
    runs = dict(zip(names, (a, b), strict=True))
    pair_ratios = [y["rps"] / x["rps"] for x, y in zip(a, b, strict=True)]
    cpu_pair_ratios = [y["cpu_us_per_request"] / x["cpu_us_per_request"]
                       for x, y in zip(a, b, strict=True)]
    total = {n: sum(r["requests"] for r in runs[n]) for n in names}
    cpu = {n: sum(r["cpu_s"] for r in runs[n]) / total[n] * 1e6 for n in names}
    rps = {n: total[n] / (window_s * len(runs[n])) for n in names}

    def side(n: str) -> dict[str, Any]:
        out = {"name": n, "api": apis[n], "env": sides[n], "runs": runs[n], "rps": rps[n],
               "cpu_us_per_request": cpu[n],
               "per_request": {k: sum(r.get(k, 0) for r in runs[n]) / total[n]
                               for k in ("syscalls", "voluntary", "involuntary")}}
        if stream:
            out["cpu_us_per_chunk"] = cpu[n] / payloads.STREAM_CHUNKS
        return out

    return {
        "a": side(names[0]),
        "b": side(names[1]),
        "mode": "stream" if stream else "non-stream",
        "ratio": total[names[1]] / total[names[0]],
        "median_pair_ratio": statistics.median(pair_ratios),
        "pair_ratios": pair_ratios,
        # A's CPU per request over B's (how much cheaper A is); see cpu_per_request_ratio
        "cpu_ratio": cpu[names[0]] / cpu[names[1]],
        # B's CPU per request over A's, over all windows, and per pair with quartiles
        "cpu_per_request_ratio": cpu[names[1]] / cpu[names[0]],
        "cpu_pair_ratios": cpu_pair_ratios,
        "cpu_pair_quartiles": quartiles(cpu_pair_ratios),
        "window_s": window_s,
        "loadavg_end": os.getloadavg(),
    }


def report(summary: dict[str, Any]) -> str:
    """The markdown table and the ratio lines of a summary."""
    a, b = summary["a"], summary["b"]
    stream = summary["mode"] == "stream"
    head = "| set-up | API | req/s (all windows) | CPU µs/request |"
    rule = "|---|---|---:|---:|"
    if stream:
        head += " CPU µs/chunk |"
        rule += "---:|"
    lines = ["", head, rule]
    for s in (a, b):
        row = f"| {s['name']} | {s['api']} | {s['rps']:,.0f} | {s['cpu_us_per_request']:.1f} |"
        if stream:
            row += f" {s['cpu_us_per_chunk']:.2f} |"
        lines.append(row)
    if "hop" in summary:  # nginx's own CPU: its master and worker
        h = summary["hop"]
        row = f"| {h['name']} | chat | {h['rps']:,.0f} | {h['cpu_us_per_request']:.1f} |"
        lines.append(row + (" |" if stream else ""))
    if "idle_cpu_per_s" in a:
        lines.append("")
        lines.append("idle (while the other side was loaded): " + ", ".join(
            f"{s['name']} {s['idle_cpu_per_s'] * 1000:.1f} ms CPU/s" for s in (a, b)))
    lines.append("")
    lines.append("per request (all windows): " + "; ".join(
        f"{s['name']} {s['per_request']['syscalls']:.2f} read/write syscalls, "
        f"{s['per_request']['voluntary']:.3f} voluntary + "
        f"{s['per_request']['involuntary']:.3f} involuntary context switches"
        for s in (a, b) if "per_request" in s))
    pr = summary["pair_ratios"]
    q = quartiles(pr)
    c1, c2, c3 = summary["cpu_pair_quartiles"]
    cp = summary["cpu_pair_ratios"]
    lines += [
        "",
        f"{b['name']} / {a['name']} ({summary['mode']}, {len(pr)} pairs): "
        f"{summary['ratio']:.3f} by requests over all windows; per-pair ratios median "
        f"{summary['median_pair_ratio']:.3f}, quartiles {q[0]:.3f} .. {q[2]:.3f}, range "
        f"{min(pr):.3f} .. {max(pr):.3f}",
        f"CPU per request {b['name']} / {a['name']}: {summary['cpu_per_request_ratio']:.3f} "
        f"over all windows; per-pair median {c2:.3f}, quartiles {c1:.3f} .. {c3:.3f}, range "
        f"{min(cp):.3f} .. {max(cp):.3f}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
