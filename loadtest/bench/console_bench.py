"""The console at 10 million records: its pages' time, and what serving them does to the proxy.

``python -m loadtest.bench.console_bench`` makes one run of two measurements against one
``gateway serve`` (one worker pinned to ``--proxy-cpu``) with everything on: quotas in its own
redis-server, the ledger in its own PostgreSQL, the console enabled.

**The data.** ``--records`` (10,000,000) usage records of a month (November 2026) for 200
tenants in 10 teams of 3 organizations, made and rolled up as ``usage_query_bench`` makes them
(``INSERT ... SELECT`` into the day partitions, the hourly rollups by migration 2's back-fill,
the daily ones by the gateway's own compaction), except that the month's last day is left
open, as today is in a month still running, compacted as the gateway's maintenance leaves it
at 23:59:59 (its hours' tenant rollups up to 23:00; the last hour in the hourly rollups only):
a current month's page at the end of its day. The policy names every tenant, team and
organization with budgets, and a key for each tenant.

**The pages** (``--pages`` requests each, one after the other, as a browser does; client-side
time from the request to the whole body): a tenant's month (``/console/tenants/<t>?month=
2026-11``) as that tenant's session, and as the operator's session for a random tenant each
time; the operator's page for the month (every tenant's, team's and organization's spend);
the live pools (``live.json``) and the audit page. Reported: p50, p95, p99 and the worst, in
ms (the issue's target: p95 <= 300 ms), and beside each page the latency of a probe (``GET
/healthz`` every 5 ms on its own connection) while the pages are made, against the same probe
on the idle worker: how long the worker's event loop, which the proxy shares, waited behind a
page.

**The proxy under load.** wrk on ``--client-cpu`` sends chat completions at ``--connections``
(16) to the gateway, in front of the nginx fixture backend (which answers at once, so the
gateway's core is saturated), or with ``--paced-ms`` streams of 64 tokens from a backend that
paces them like an engine's decode steps (``fastserver``), for ``--rounds`` pairs of
``--duration`` s windows: one window with nothing else, one while ``--viewers`` console
viewers (threads, each one operator session, as a browser with the console open) poll
``live.json`` every ``--poll`` s and load a page every ``--navigate`` s (the operator's page
and a tenant's month in turn), the order of the two windows alternating. Reported: each
window's p50, p99 and requests/s, the median of the per-pair differences (console - quiet),
and as the noise to read them against, the spread of the quiet windows' p99 (the difference
between the 75th and 25th percentiles).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx

from gateway.console import views
from loadtest.bench import usage_query_bench
from loadtest.bench.overhead import nginx, payloads, wrk
from loadtest.bench.overhead.procs import (
    HOST,
    ProcessSet,
    ensure_tools,
    free_ports,
    pinned,
    wait_http_ok,
)
from loadtest.bench.pgserver import PostgresServer
from loadtest.bench.redis_local import redis_server

__all__ = ["main"]

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "console-bench.json"
ADMIN_TOKEN = "console-bench-admin-token-0123456789"
MONTH = "2026-11"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def tenant_key(i: int) -> str:
    return f"sk-gw-console-bench-{i:03d}-0123456789abcdef0123456789"


def policy_yaml(args: argparse.Namespace, backend_port: int, workdir: Path) -> str:
    """Every tenant of the generated data (``t000``...), its team (``team<t % 10>``) and
    organization (``org<t % 10 % 3>``, as ``usage_query_bench`` names them), budgets at
    every level, a key per tenant, one model on the nginx backend."""
    keys = "".join(
        f"    - {{id: k{i:03d}, tenant: t{i:03d}, "
        f"sha256: {hashlib.sha256(tenant_key(i).encode()).hexdigest()}}}\n"
        for i in range(args.tenants))
    tenants = "".join(f"  - {{name: t{i:03d}, plan: std, team: team{i % 10}}}\n"
                      for i in range(args.tenants))
    teams = "".join(f"  - {{name: team{j}, organization: org{j % 3}, "
                    f"limits: {{tokens_per_month: 100000000000000}}}}\n" for j in range(10))
    orgs = "".join(f"  - {{name: org{j}, limits: {{cost_per_month: \"100000000\"}}, "
                   f"alerts: {{thresholds: [50, 90]}}}}\n" for j in range(3))
    return f"""\
server:
  max_body_bytes: 8388608
auth:
  keys:
{keys}plans:
  - name: std
    limits: {{rpm: 100000000, tpm: 100000000000, concurrency: 100000,
             tokens_per_day: 100000000000000, cost_per_month: "100000000"}}
tenants:
{tenants}teams:
{teams}organizations:
{orgs}store:
  data_dir: {workdir / "data"}
  spool_dir: {workdir / "spool"}
console: {{enabled: true}}
pools:
  - name: bench
    class: interactive
    backends:
      - name: nginx
        url: http://{HOST}:{backend_port}
        max_in_flight: 4096
models:
  - name: {payloads.MODEL}
    pool: bench
"""


def sign_in(base: str, role: str, secret: str) -> httpx.Client:
    """A client holding a console session (the sign-in form's CSRF token and cookie)."""
    client = httpx.Client(base_url=base, timeout=60.0)
    form = client.get("/console/login")
    match = _CSRF.search(form.text)
    if match is None:
        raise RuntimeError(f"no sign-in form at {base}/console/login: {form.status_code}")
    answer = client.post("/console/login",
                         data={"csrf": match.group(1), "role": role, "secret": secret})
    if answer.status_code not in (302, 303):
        raise RuntimeError(f"{role} sign-in refused: {answer.status_code} {answer.text[:200]}")
    return client


def _percentiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50": at(0.50), "p95": at(0.95), "p99": at(0.99),
            "max": round(ordered[-1], 2)}


def _probe(base: str, stop: Any, out: Any) -> None:
    """The probe's process: ``GET /healthz`` every 5 ms until ``stop``; its ms to ``out``."""
    ms: list[float] = []
    with httpx.Client(base_url=base, timeout=30.0) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            client.get("/healthz")
            ms.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.005)
    out.send(ms)


class Probe:
    """``GET /healthz`` every 5 ms on a keep-alive connection of its own, in a process of its
    own (a thread would wait for this process's GIL behind the page client): its latencies
    while a page is made are how long the worker's event loop (the proxy's too) waited behind
    it (``loop_stall.py`` measures hostile requests the same way)."""

    def __init__(self, base: str) -> None:
        context = multiprocessing.get_context("fork")
        self.stop = context.Event()
        self.receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=_probe, args=(base, self.stop, send),
                                       daemon=True)
        self.ms: list[float] = []

    def __enter__(self) -> Probe:
        self.process.start()
        time.sleep(0.2)  # connected and probing before the pages start
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.receive.poll(30):
            self.ms = self.receive.recv()
        self.process.join(timeout=30)


def time_pages(base: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each page ``--pages`` times; ms per request, client side; beside each, the probe's
    latencies (``Probe``: the event loop's waits), and the probe on the idle worker."""
    rng = random.Random(args.seed)
    mine = rng.randrange(args.tenants)
    tenant = sign_in(base, "tenant", tenant_key(mine))
    operator = sign_in(base, "operator", ADMIN_TOKEN)
    pages: dict[str, tuple[httpx.Client, Any]] = {
        "tenant's month, own session": (
            tenant, lambda: f"/console/tenants/t{mine:03d}?month={MONTH}"),
        "a tenant's month, operator": (
            operator, lambda: f"/console/tenants/t{rng.randrange(args.tenants):03d}"
                              f"?month={MONTH}"),
        "operator's page (month)": (operator, lambda: f"/console/operator?month={MONTH}"),
        "live pools (live.json)": (operator, lambda: "/console/operator/live.json"),
        "audit log": (operator, lambda: "/console/operator/audit"),
    }
    out: dict[str, dict[str, float]] = {}
    try:
        with Probe(base) as idle:
            time.sleep(3)
        out["(idle worker)"] = {"probe_p99": _percentiles(idle.ms)["p99"],
                                "probe_max": _percentiles(idle.ms)["max"]}
        for name, (client, path) in pages.items():
            for _ in range(3):  # warm: the first read of a table pays its pages into memory
                client.get(path()).raise_for_status()
            ms: list[float] = []
            with Probe(base) as probe:
                for _ in range(args.pages):
                    t0 = time.perf_counter()
                    answer = client.get(path())
                    ms.append((time.perf_counter() - t0) * 1000)
                    if answer.status_code != 200:
                        raise RuntimeError(f"{name}: {answer.status_code} {answer.text[:200]}")
            waits = _percentiles(probe.ms)
            out[name] = {**_percentiles(ms), "probe_p99": waits["p99"],
                         "probe_max": waits["max"]}
            print(f"[console] {name}: {out[name]}", file=sys.stderr, flush=True)
    finally:
        tenant.close()
        operator.close()
    return out


class Viewers:
    """``n`` console viewers in threads while ``running`` is set, each an operator session
    behaving as a browser with the console open: ``live.json`` every ``poll`` s (what the
    operator page's script does) and, every ``navigate`` s, the next page (the operator's
    page, then a tenant's month, in turn). The viewers start their cycles spread out."""

    def __init__(self, base: str, n: int, poll: float, navigate: float, tenants: int) -> None:
        self.clients = [sign_in(base, "operator", ADMIN_TOKEN) for _ in range(n)]
        self.poll, self.navigate = poll, navigate
        self.tenants = tenants
        self.running = threading.Event()
        self.stopped = threading.Event()
        self.pages = 0
        self.errors = 0
        self._threads = [threading.Thread(target=self._loop, args=(c, i), daemon=True)
                         for i, c in enumerate(self.clients)]
        for t in self._threads:
            t.start()

    def _loop(self, client: httpx.Client, i: int) -> None:
        rng = random.Random(i)
        pages = [lambda: f"/console/operator?month={MONTH}",
                 lambda: f"/console/tenants/t{rng.randrange(self.tenants):03d}?month={MONTH}"]
        step = 0
        next_poll = time.monotonic() + rng.uniform(0, self.poll)
        next_page = time.monotonic() + rng.uniform(0, self.navigate)
        while not self.stopped.is_set():
            if not self.running.wait(0.1):
                continue
            now = time.monotonic()
            if now >= next_page:
                path, next_page = pages[step % len(pages)](), now + self.navigate
                step += 1
            elif now >= next_poll:
                path, next_poll = "/console/operator/live.json", now + self.poll
            else:
                time.sleep(min(next_poll, next_page) - now)
                continue
            try:
                ok = client.get(path).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.pages += 1
            self.errors += not ok

    def close(self) -> None:
        self.stopped.set()
        self.running.clear()
        for t in self._threads:
            t.join(timeout=70)
        for c in self.clients:
            c.close()


def proxy_windows(args: argparse.Namespace, tools: dict[str, str], port: int, base: str,
                  workdir: Path) -> dict[str, Any]:
    """Alternating quiet / console windows of wrk at ``--connections``."""
    key = tenant_key(0)
    script = workdir / "chat.lua"
    script.write_text(wrk.lua_script(payloads.request_body(stream=args.paced_ms > 0),
                                     payloads.request_headers(key)))
    url = f"http://{HOST}:{port}{payloads.API_PATHS['chat']}"
    viewers = Viewers(base, args.viewers, args.poll, args.navigate, args.tenants)
    windows: dict[str, list[dict[str, float]]] = {"quiet": [], "console": []}
    pages_per_window: list[int] = []
    try:
        wrk.run(tools["wrk"], url, script, connections=args.connections, duration_s=2,
                cpus=args.client_cpu)  # warm-up
        for r in range(args.rounds):
            order = ("quiet", "console") if r % 2 == 0 else ("console", "quiet")
            for kind in order:
                before = viewers.pages
                if kind == "console":
                    viewers.running.set()
                result = wrk.run(tools["wrk"], url, script, connections=args.connections,
                                 duration_s=args.duration, cpus=args.client_cpu)
                viewers.running.clear()
                if result.error_count:
                    raise RuntimeError(f"{result.error_count} failed requests: {result.errors}")
                if kind == "console":
                    pages_per_window.append(viewers.pages - before)
                windows[kind].append({"p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
                                      "rps": result.rps})
                print(f"[console] round {r} {kind}: p50 {result.p50_ms:.3f} "
                      f"p99 {result.p99_ms:.3f} ms, {result.rps:.0f} req/s", file=sys.stderr,
                      flush=True)
                time.sleep(0.5)  # the viewers' last pages end before the next window
    finally:
        viewers.close()
    diffs = {m: [c[m] - q[m] for q, c in zip(windows["quiet"], windows["console"], strict=True)]
             for m in ("p50_ms", "p99_ms", "rps")}
    quiet_p99 = sorted(w["p99_ms"] for w in windows["quiet"])
    q1, _, q3 = statistics.quantiles(quiet_p99, n=4) if len(quiet_p99) >= 2 else (0, 0, 0)
    return {
        "windows": windows,
        "console_pages_per_window": pages_per_window,
        "viewer_errors": viewers.errors,
        "median": {kind: {m: statistics.median(w[m] for w in ws) for m in ("p50_ms", "p99_ms",
                                                                             "rps")}
                   for kind, ws in windows.items()},
        "median_difference": {m: statistics.median(d) for m, d in diffs.items()},
        "quiet_p99_iqr_ms": q3 - q1,
    }


def report(out: dict[str, Any]) -> str:
    lines = [f"Console at {int(out['args']['records']):,} records "
             f"(load average {out['loadavg_start'][0]:.1f} -> {out['loadavg'][0]:.1f})", "",
             "| page | n | p50 ms | p95 ms | p99 ms | max ms | probe p99 / max ms |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in out["pages"].items():
        if "n" not in s:
            lines.append(f"| {name} | | | | | | {s['probe_p99']} / {s['probe_max']} |")
            continue
        lines.append(f"| {name} | {s['n']} | {s['p50']} | **{s['p95']}** | {s['p99']} | "
                     f"{s['max']} | {s['probe_p99']} / {s['probe_max']} |")
    proxy = out.get("proxy")
    if proxy is None:
        return "\n".join(lines)
    m, d = proxy["median"], proxy["median_difference"]
    load = ("streams of 64 tokens paced " + out["args"]["paced_ms"] + " ms apart"
            if float(out["args"]["paced_ms"]) > 0 else "chat completions from nginx")
    lines += ["", f"Proxy ({load}) at {out['args']['connections']} connections, "
              f"{out['args']['rounds']} pairs of {out['args']['duration']} s windows, "
              f"{out['args']['viewers']} console viewers (live.json every "
              f"{out['args']['poll']} s, a page every {out['args']['navigate']} s; requests "
              f"per console window: {proxy['console_pages_per_window']}):", "",
              "| windows | p50 ms | p99 ms | requests/s |", "|---|---:|---:|---:|",
              f"| quiet | {m['quiet']['p50_ms']:.3f} | {m['quiet']['p99_ms']:.3f} | "
              f"{m['quiet']['rps']:.0f} |",
              f"| console viewers | {m['console']['p50_ms']:.3f} | {m['console']['p99_ms']:.3f} "
              f"| {m['console']['rps']:.0f} |",
              f"| median pair difference | {d['p50_ms']:+.3f} | **{d['p99_ms']:+.3f}** | "
              f"{d['rps']:+.0f} |", "",
              f"Spread of the quiet windows' p99 (IQR): {proxy['quiet_p99_iqr_ms']:.3f} ms."]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.console_bench",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--tenants", type=int, default=200)
    p.add_argument("--pages", type=int, default=200, help="requests per page (200)")
    p.add_argument("--rounds", type=int, default=8, help="pairs of proxy windows (8)")
    p.add_argument("--duration", type=int, default=5, help="seconds per proxy window (5)")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--viewers", type=int, default=4, help="console viewers (4)")
    p.add_argument("--poll", type=float, default=3.0,
                   help="seconds between a viewer's live.json polls (3, as the page's script)")
    p.add_argument("--navigate", type=float, default=10.0,
                   help="seconds between a viewer's page loads (10)")
    p.add_argument("--skip-proxy", action="store_true", help="the pages only")
    p.add_argument("--paced-ms", type=float, default=0.0,
                   help="the proxy's load as streams from a paced backend (fastserver, 64 "
                   "tokens this many ms apart) instead of nginx's instant answers (0)")
    p.add_argument("--proxy-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--backend-cpu", default="1")
    p.add_argument("--seed", type=int, default=39)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


async def _agree(url: str) -> dict[str, int]:
    """The month per tenant from the tenant rollups (what the operator's page reads) against
    the same sums per tenant and model (the group rollups), summed here: equal, or the run
    stops. Returns the month's requests per source."""
    from gateway.ledger.sql.postgres import PostgresLedger

    spool = Path(tempfile.mkdtemp(prefix="console-bench-check-"))
    ledger = PostgresLedger(url, spool_dir=spool)
    lo, hi = usage_query_bench._ms(usage_query_bench.MONTH), usage_query_bench._ms(
        date(2026, 12, 1))
    try:
        by_tenant: dict[str, int] = {}
        for row in await views.read_rows(ledger, None, lo, hi, ("tenant",)):
            by_tenant[row.tenant or ""] = row.requests
        summed: dict[str, int] = {}
        for row in await views.read_rows(ledger, None, lo, hi, ("tenant", "model")):
            summed[row.tenant or ""] = summed.get(row.tenant or "", 0) + row.requests
    finally:
        await ledger.close()
        shutil.rmtree(spool, ignore_errors=True)
    if by_tenant != summed:
        raise RuntimeError("the tenant rollups disagree with the group rollups")
    return {"tenant_rollups": sum(by_tenant.values()), "group_rollups": sum(summed.values())}


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


def _load(url: str, args: argparse.Namespace) -> dict[str, float]:
    data = argparse.Namespace(records=args.records, tenants=args.tenants, keys=20, models=5,
                              versions=3, open_last_day=True)
    return asyncio.run(usage_query_bench.load(url, data))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tools = ensure_tools(("nginx", "wrk", "taskset"))
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                           "loadavg_start": os.getloadavg()}
    workdir = Path(tempfile.mkdtemp(prefix="console-bench-"))
    procs = ProcessSet()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        pg = stack.enter_context(PostgresServer().start())
        redis_url = stack.enter_context(redis_server())
        stack.callback(procs.stop_all)  # the gateway stops before its servers
        t0 = time.perf_counter()
        out["load"] = _load(pg.url, args)
        print(f"[console] {args.records:,} records loaded in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
        out["requests_in_month"] = asyncio.run(_agree(pg.url))
        print(f"[console] rollups agree: {out['requests_in_month']}", file=sys.stderr,
              flush=True)
        if args.paced_ms > 0:  # streams paced like an engine's decode (fastserver)
            (backend_port,) = free_ports(1)
            paced = procs.start("paced", pinned(
                [sys.executable, "-m", "loadtest.bench.fastserver", "--port", str(backend_port),
                 "--interval-ms", str(args.paced_ms)], args.backend_cpu), workdir / "paced.log")
            deadline = time.monotonic() + 30
            while not _listening(backend_port):
                if time.monotonic() > deadline or paced.proc.poll() is not None:
                    raise RuntimeError(f"fastserver did not start: {paced.log_tail()}")
                time.sleep(0.1)
        else:
            backend = nginx.PortPair(*free_ports(2))
            nginx.start(procs, tools["nginx"], workdir, "backend",
                        nginx.backend_config(workdir, backend, args.backend_cpu), backend,
                        args.backend_cpu)
            backend_port = backend.json
        (port,) = free_ports(1)
        config = workdir / "gateway.yaml"
        config.write_text(policy_yaml(args, backend_port, workdir))
        binary = Path(sys.executable).parent / "gateway"
        env = {"GATEWAY_REDIS_URL": redis_url, "GATEWAY_LEDGER_URL": pg.url,
               "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
        os.environ.update(env)
        gw = procs.start("gateway", pinned([str(binary), "serve", "--config", str(config),
                                            "--host", HOST, "--port", str(port),
                                            "--workers", "1"], args.proxy_cpu),
                         workdir / "gateway.log")
        wait_http_ok(gw, port, "/healthz", timeout=60.0)
        base = f"http://{HOST}:{port}"
        out["pages"] = time_pages(base, args)
        if not args.skip_proxy:
            out["proxy"] = proxy_windows(args, tools, port, base, workdir)
        out["loadavg"] = os.getloadavg()
    print(report(out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
