"""Overload benchmarks: interactive borrowing, batch borrowing and load shedding (issue #18).

``python -m loadtest.bench.overload_bench --workload prefill-heavy|light|overload``

Interactive requests are ~2,300-token prompts with ~25-token outputs (the shape of the Azure
code trace: prefill-bound), sent open-loop as a seeded Poisson process; batch is a closed-loop
backlog of 1,000-token prompts with 128-token outputs. Each scenario gets fresh simulated
engines (``gateway sim``, slowed by ``--engine-speed`` so one interactive engine prefills less
than the offered rate, as a larger model would) and a fresh gateway; all scenarios of a
workload run in one invocation, so they compare like with like.

Workloads and their scenarios:

- ``prefill-heavy`` (``--rate`` interactive req/s beside the batch backlog; one interactive and
  one batch engine): ``class-borrow`` (class routing, interactive ``ttft_target`` with a
  lending batch pool, batch ``borrow`` on the interactive pool), ``round-robin`` (one pool of
  both engines, no classes), ``class`` (class routing as before this change: batch may borrow,
  interactive stays on its pool);
- ``light`` (the same at ``--rate / 3``): ``static`` (class routing, no borrowing either way)
  and ``class-borrow``: batch borrowing must not cost interactive attainment;
- ``overload`` (interactive only, one engine, offered ``--overload`` x the engine's capacity,
  measured by the no-shed run's completions): ``shed`` (pool ``shed:``) and ``no-shed``.

Prints a markdown table and writes JSON to ``loadtest/results/overload-<workload>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from loadtest.bench.routing_bench import KEY, WORD, _free_port, _wait, pct

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = {
    "prefill-heavy": ("class-borrow", "round-robin", "class"),
    "light": ("static", "class-borrow"),
    "overload": ("no-shed", "shed"),
}


@dataclass
class Results:
    ttft: list[float] = field(default_factory=list)  # admitted interactive requests
    by_pool: dict[str, list[float]] = field(default_factory=dict)  # their TTFT by pool
    samples: list[tuple[float, str, float]] = field(default_factory=list)  # (at, pool, TTFT)
    refused: list[float] = field(default_factory=list)  # seconds until a 503 came back
    retry_after: list[int] = field(default_factory=list)
    errors: int = 0
    batch_tokens: int = 0
    batch_done: int = 0
    batch_refused: int = 0


async def chat(session: aiohttp.ClientSession, url: str, prompt: int, max_tokens: int,
               cls: str, stream: bool = True) -> tuple[int, float | None, int, str | None]:
    """One chat completion: (status, TTFT s or refusal time, output tokens, Retry-After or,
    for a 200, the pool that served it).

    Batch is sent without streaming (its output tokens from ``usage``): fewer chunks through
    the gateway and the load generator on a box whose cores they share with the engines.
    """
    body: dict[str, Any] = {
        "model": "chat", "stream": stream, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": WORD * max(1, prompt - 8)}]}
    headers = {"Authorization": f"Bearer {KEY}", "X-Request-Class": cls}
    t0 = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status != 200:
            await r.read()
            return r.status, time.perf_counter() - t0, 0, r.headers.get("Retry-After")
        if not stream:
            answer = await r.json()
            return 200, None, int(answer.get("usage", {}).get("completion_tokens", 0)), None
        ttft, chunks = None, 0
        pool = r.headers.get("x-gateway-pool")
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content":"' in line and \
                    b'"content":""' not in line:
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
        return 200, ttft, chunks, pool


async def run_load(url: str, args: argparse.Namespace, rate: float, batch: bool) -> Results:
    res = Results()
    arrivals = _arrivals(args, rate)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        start = time.perf_counter()
        stop_at = start + args.duration

        async def interactive(at: float) -> None:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                status, seconds, _, retry = await chat(session, url, args.prompt, args.output,
                                                       "interactive")
            except Exception:
                status, seconds, retry = 0, None, None
            if at < args.warmup:  # the same warm-up is left out of every scenario's figures
                if status == 200 and seconds is not None:
                    res.samples.append((round(at, 3), f"warmup-{retry}", round(seconds, 4)))
                return
            if status == 200 and seconds is not None:
                res.ttft.append(seconds)
                res.by_pool.setdefault(retry or "?", []).append(seconds)
                res.samples.append((round(at, 3), retry or "?", round(seconds, 4)))
            elif status == 503 and seconds is not None:
                res.refused.append(seconds)
                if retry and retry.isdigit():
                    res.retry_after.append(int(retry))
            else:
                res.errors += 1

        async def batch_worker() -> None:
            while time.perf_counter() < stop_at:
                try:
                    status, _, chunks, _ = await chat(session, url, args.batch_prompt,
                                                      args.batch_output, "batch", stream=False)
                except Exception:
                    status, chunks = 0, 0
                if status == 200 and time.perf_counter() <= stop_at:
                    res.batch_tokens += chunks
                    res.batch_done += 1
                elif status != 200:
                    res.batch_refused += 1
                    await asyncio.sleep(0.2)

        tasks = [asyncio.create_task(interactive(a)) for a in arrivals]
        workers = [asyncio.create_task(batch_worker()) for _ in range(args.batch_workers)] \
            if batch else []
        await asyncio.gather(*tasks)
        if workers:
            await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return res


def policy(scenario: str, sims: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    interactive: dict[str, Any] = {"name": "interactive", "priority": 0,
                                   "start_deadline": args.deadline}
    if scenario in ("class-borrow", "shed"):
        interactive["ttft_target"] = args.ttft_target
    base: dict[str, Any] = {
        "auth": {"keys": [{"id": "bench", "sha256": sha, "allow_class_header": True}]},
        "classes": [interactive, {"name": "batch", "priority": 10, "start_deadline": 600}],
    }
    signals = {"interval": 0.5, "timeout": 0.5}
    inter = {"name": "sim-i", "url": sims["interactive"], "max_in_flight": args.interactive_cap}
    ipool: dict[str, Any] = {"name": "interactive", "class": "interactive", "backends": [inter],
                             "queue_size": 100000, "signals": signals}
    if scenario in ("no-shed", "shed"):
        if scenario == "shed":
            ipool["shed"] = {"margin": args.margin}
        base["pools"] = [ipool]
        base["models"] = [{"name": "chat", "pool": "interactive", "backend_model": "sim-model"}]
        return base
    bat = {"name": "sim-b", "url": sims["batch"], "max_in_flight": args.batch_cap}
    if scenario == "round-robin":
        base["pools"] = [{"name": "all", "class": "interactive", "strategy": "round_robin",
                          "backends": [inter, bat], "queue_size": 100000}]
        base["models"] = [{"name": "chat", "pool": "all", "backend_model": "sim-model"}]
        return base
    bpool: dict[str, Any] = {"name": "batch", "class": "batch", "backends": [bat],
                             "queue_size": 100000, "signals": signals}
    if scenario in ("class", "class-borrow"):
        ipool["borrow"] = {"max_share": args.borrow_share, "ttft_p90_target": args.ttft_target}
    if scenario == "class-borrow":
        bpool["lend"] = {"own_share": args.own_share}
    base["pools"] = [ipool, bpool]
    base["models"] = [{"name": "chat", "pool": "interactive", "pools": {"batch": "batch"},
                       "backend_model": "sim-model"}]
    return base


def start_sims(args: argparse.Namespace, env: dict[str, str],
               procs: list[subprocess.Popen[bytes]]) -> dict[str, str]:
    sims = {}
    for profile in ("interactive", "batch"):
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "sim", "--profile", profile, "--port", str(port),
             "--queue-limit", "100000", "--speedup", str(args.engine_speed),
             "--seed", str(args.seed),
             # the prompts repeat one word: with prefix caching every one would be a hit
             "--no-prefix-caching"], env=env)
        procs.append(proc)
        sims[profile] = f"http://127.0.0.1:{port}"
        _wait(sims[profile] + "/health", proc)
        _warm(sims[profile], args.prompt)
    return sims


def _warm(url: str, prompt: int) -> None:
    """One request straight to a fresh engine: its first pays for loading the tokenizer (~1-5 s
    on a busy box), which a serving engine has long done; left in, it stalls every scenario's
    first seconds alike and the predictor learns that stall as the engine's speed."""
    import urllib.request

    body = json.dumps({"model": "sim-model", "max_tokens": 1, "messages": [
        {"role": "user", "content": WORD * prompt}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def run_scenario(scenario: str, workload: str, rate: float, args: argparse.Namespace,
                 tmp: Path, env: dict[str, str]) -> Results:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sims = start_sims(args, env, procs)
        cfg = tmp / f"{scenario}.yaml"
        cfg.write_text(yaml.safe_dump(policy(scenario, sims, args)))
        port = _free_port()
        gw = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(cfg),
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL)
        procs.append(gw)
        _wait(f"http://127.0.0.1:{port}/healthz", gw)
        batch = workload != "overload"
        print(f"[overload-bench] {workload}/{scenario}: {rate:.2f} interactive req/s for "
              f"{args.duration:.0f}s" + (f" + {args.batch_workers} batch workers" if batch
                                         else ""), file=sys.stderr, flush=True)
        return asyncio.run(run_load(f"http://127.0.0.1:{port}", args, rate, batch))
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def row(scenario: str, res: Results, offered: int, args: argparse.Namespace) -> dict[str, Any]:
    within = sum(1 for t in res.ttft if t <= args.deadline)
    target = sum(1 for t in res.ttft if t <= args.ttft_target)
    return {
        "scenario": scenario,
        "interactive_offered": offered,
        "admitted": len(res.ttft),
        "refused": len(res.refused),
        "refusal_p99_ms": pct(res.refused, 0.99) * 1000,
        "retry_after_median": pct([float(x) for x in res.retry_after], 0.5),
        "errors": res.errors,
        "ttft_p50_ms": pct(res.ttft, 0.5) * 1000,
        "ttft_p99_ms": pct(res.ttft, 0.99) * 1000,
        "within_target_of_offered": target / max(1, offered),
        "within_deadline_of_admitted": within / max(1, len(res.ttft)),
        "within_deadline_of_offered": within / max(1, offered),
        "admitted_per_s": len(res.ttft) / args.duration,
        "batch_tokens_per_s": res.batch_tokens / args.duration,
        "batch_requests": res.batch_done,
        "batch_refused": res.batch_refused,
        "interactive_by_pool": {
            name: {"requests": len(v), "ttft_p50_ms": pct(v, 0.5) * 1000,
                   "ttft_p99_ms": pct(v, 0.99) * 1000} for name, v in sorted(res.by_pool.items())},
        "samples": sorted(res.samples),
    }


def table(workload: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    if workload == "overload":
        lines = [f"| scenario | offered | admitted | refused (p99 ms to refuse) | TTFT p50 ms | "
                 f"p99 ms | admitted within {args.deadline:g} s | offered within |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(
                f"| {r['scenario']} | {r['interactive_offered']} | {r['admitted']} | "
                f"{r['refused']} ({r['refusal_p99_ms']:.0f}) | {r['ttft_p50_ms']:.0f} | "
                f"{r['ttft_p99_ms']:.0f} | {100 * r['within_deadline_of_admitted']:.1f}% | "
                f"{100 * r['within_deadline_of_offered']:.1f}% |")
        return "\n".join(lines)
    lines = [f"| scenario | interactive TTFT p50 ms | p99 ms | within {args.ttft_target * 1000:.0f}"
             f" ms | interactive errors/refused | batch output tok/s | batch requests |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    lines[0] += " interactive by pool (requests, p50/p99 ms) |"
    for r in rows:
        pools = "; ".join(f"{n} {v['requests']} ({v['ttft_p50_ms']:.0f}/{v['ttft_p99_ms']:.0f})"
                          for n, v in r["interactive_by_pool"].items())
        lines.append(
            f"| {r['scenario']} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
            f"{100 * r['within_target_of_offered']:.1f}% | {r['errors'] + r['refused']} | "
            f"{r['batch_tokens_per_s']:,.0f} | {r['batch_requests']} | {pools} |")
    return "\n".join(lines)


def verdicts(workload: str, by: dict[str, dict[str, Any]]) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    if workload == "prefill-heavy" and {"class-borrow", "round-robin"} <= by.keys():
        a, rr = by["class-borrow"], by["round-robin"]
        for q in ("p50", "p99"):
            ratio = a[f"ttft_{q}_ms"] / rr[f"ttft_{q}_ms"]
            out.append((ratio <= 1.0, f"interactive TTFT {q} {ratio:.2f}x round robin "
                                      "(target <= 1.0x)"))
        if "class" in by:
            ratio = a["ttft_p99_ms"] / by["class"]["ttft_p99_ms"]
            out.append((ratio < 1.0, f"interactive TTFT p99 {ratio:.2f}x today's class routing"))
    if workload == "light" and {"class-borrow", "static"} <= by.keys():
        a, s = by["class-borrow"], by["static"]
        d = 100 * (a["within_target_of_offered"] - s["within_target_of_offered"])
        out.append((d >= -1.0, f"interactive attainment {d:+.1f} points vs static "
                               "(target: no worse; 1 point of noise allowed)"))
        share = a["batch_tokens_per_s"] / max(1e-9, s["batch_tokens_per_s"])
        out.append((share >= 1.0, f"batch throughput {100 * share:.0f}% of static"))
    if workload == "overload" and {"shed", "no-shed"} <= by.keys():
        s, n = by["shed"], by["no-shed"]
        out.append((s["within_deadline_of_admitted"] >= 0.99,
                    f"shed: {100 * s['within_deadline_of_admitted']:.1f}% of admitted within "
                    "deadline (target >= 99%)"))
        out.append((s["refusal_p99_ms"] < 100 or not s["refused"],
                    f"shed: refusals answered in p99 {s['refusal_p99_ms']:.0f} ms (at once)"))
        out.append((n["within_deadline_of_admitted"] < 0.9,
                    f"no-shed: {100 * n['within_deadline_of_admitted']:.1f}% within deadline "
                    "(collapses)"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.overload_bench",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(SCENARIOS), default="prefill-heavy")
    p.add_argument("--scenarios", help="comma-separated subset of the workload's scenarios")
    p.add_argument("--duration", type=float, default=40.0, help="seconds per scenario (40)")
    p.add_argument("--rate", type=float, default=5.0,
                   help="interactive req/s of prefill-heavy (light: a third of it) (5)")
    p.add_argument("--overload", type=float, default=1.5,
                   help="overload: offered load / engine capacity (1.5)")
    p.add_argument("--capacity", type=float, default=0.0,
                   help="overload: the interactive engine's capacity in req/s (default: from "
                   "the cost model of the simulator profile at --engine-speed)")
    p.add_argument("--prompt", type=int, default=2300, help="interactive prompt tokens")
    p.add_argument("--output", type=int, default=25, help="interactive output tokens")
    p.add_argument("--batch-workers", type=int, default=48)
    p.add_argument("--batch-cap", type=int, default=64,
                   help="batch backend max_in_flight (64, as the routing benchmark)")
    p.add_argument("--interactive-cap", type=int, default=32,
                   help="interactive backend max_in_flight")
    p.add_argument("--batch-prompt", type=int, default=1000)
    p.add_argument("--batch-output", type=int, default=128)
    p.add_argument("--engine-speed", type=float, default=0.3,
                   help="the simulators' --speedup: 0.3 = 3.3x slower than the 8B/H100 "
                   "profile, so one interactive engine prefills ~4.3 of these prompts a second")
    p.add_argument("--ttft-target", type=float, default=0.5, help="interactive TTFT target, s")
    p.add_argument("--deadline", type=float, default=30.0,
                   help="interactive start_deadline, s (overload: 2)")
    p.add_argument("--borrow-share", type=float, default=0.25)
    p.add_argument("--own-share", type=float, default=0.25,
                   help="batch pool's own share while lending (lend.own_share)")
    p.add_argument("--margin", type=float, default=0.8, help="shed.margin")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds of interactive arrivals left out of the figures (5): the "
                   "predictor learns the engines' prefill rate from the first TTFTs")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    workload = args.workload
    if workload == "overload" and args.deadline == 30.0:
        args.deadline = 2.0
    rate = args.rate
    if workload == "light":
        rate = args.rate / 3
    elif workload == "overload":
        capacity = args.capacity or engine_capacity(args)
        rate = args.overload * capacity
    scenarios = args.scenarios.split(",") if args.scenarios else list(SCENARIOS[workload])
    tmp = Path(tempfile.mkdtemp(prefix="overload-bench-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GATEWAY_ACCESS_LOG": "off"}
    rows = []
    load = []
    offered = sum(1 for at in _arrivals(args, rate) if at >= args.warmup)
    for scenario in scenarios:
        res = run_scenario(scenario, workload, rate, args, tmp, env)
        rows.append(row(scenario, res, offered, args))
        load.append(os.getloadavg()[0])
    by = {r["scenario"]: r for r in rows}
    print(f"\n{workload}: {rate:.2f} interactive req/s, {args.prompt}-token prompts, "
          f"{args.output}-token outputs, {args.duration:.0f} s per scenario, engine speed "
          f"{args.engine_speed}; load average after each: "
          + ", ".join(f"{x:.1f}" for x in load) + "\n")
    print(table(workload, rows, args))
    checks = verdicts(workload, by)
    print()
    for ok, text in checks:
        print(f"- {'PASS' if ok else 'FAIL'} {text}")
    out = args.out or ROOT / f"loadtest/results/overload-{workload}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "workload": workload, "rate": rate, "rows": rows, "load_average": load,
        "verdicts": [{"pass": ok, "text": text} for ok, text in checks],
        "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    out.with_suffix(".md").write_text(table(workload, rows, args) + "\n\n" + "\n".join(
        f"- {'PASS' if ok else 'FAIL'} {text}" for ok, text in checks) + "\n")
    return 0


def _arrivals(args: argparse.Namespace, rate: float) -> list[float]:
    rng = random.Random(args.seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= args.duration:
            return out
        out.append(t)


def engine_capacity(args: argparse.Namespace) -> float:
    """Interactive prompts a second one interactive engine can prefill, from its cost model
    (chunks of ``step_tokens``, each step's fixed cost, the decodes riding along)."""
    from gateway.sim.profiles import PROFILES

    prof = PROFILES["interactive"]
    ms, start, left = 0.0, 0, args.prompt
    while left > 0:
        k = min(left, prof.step_tokens)
        ms += prof.step_ms + prof.chunk_cost_ms(start, k)
        start, left = start + k, left - k
    return 1000.0 * args.engine_speed / ms


if __name__ == "__main__":
    raise SystemExit(main())
