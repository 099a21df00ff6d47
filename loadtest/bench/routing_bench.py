"""Routing benchmark: interactive chat from the Azure conversation trace beside a batch backlog.

``python -m loadtest.bench.routing_bench [--duration 40] [--trace PATH] [--speedup 1.0]
[--engine sim|llamacpp]``

One run compares, against the same two simulated pools (one ``interactive`` engine, one
``batch`` engine, real-time):

- ``idle``: interactive traffic alone (the baseline TTFT of an idle interactive pool);
- ``a-class``: class routing with spill-over (batch borrows the interactive pool's headroom);
- ``b-round-robin``: one pool of both backends, round robin, no classes;
- ``c-static``: class routing, static partitioning, no borrowing.

Interactive arrivals replay the trace open-loop (its ContextTokens and GeneratedTokens, prompts
synthesised to length); batch is a closed-loop backlog of long generations. The trace is read
from ``../shared/data/azure-llm-inference-2023/`` and never copied into the repository.
Prints a markdown table and writes JSON to ``loadtest/results/routing.json``.

``--engine llamacpp`` runs it on two llama-servers instead (:mod:`loadtest.bench.engine_fleet`:
the tiny random llama at ``-t 1``; the interactive one with ``--interactive-cap`` slots, 32 as
the ``interactive`` profile's running batch and its backend's ``max_in_flight``, the batch one
with ``--batch-cap`` slots, the most the gateway sends it; each slot holds the longest prompt
plus output of the workload). Every pool gets ``engine: llamacpp`` and keeps the default cache
isolation (the gateway sends ``cache_prompt: false``: no prompt reused, as the simulators run
``--no-prefix-caching``). ``--sim-profile tiny-llamacpp`` runs both simulators on the profile
calibrated against that engine, their running batches set to the same slots. The tiny engines
need a smaller workload: ``--context-scale`` scales the trace's ContextTokens, ``--max-context``
and ``--max-output`` cap them (docs/benchmarks/llamacpp.md, "Benchmarks on llama.cpp").
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import hashlib
import json
import os
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

from loadtest.bench.engine_fleet import (
    EngineSpec,
    add_engine_arguments,
    ctx_per_slot,
    pool_engine_keys,
    start_fleet,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = ROOT.parent / "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"
KEY = "sk-gw-routing-bench-0123456789abcdef0123456789abcdef"
WORD = " the"  # one token in o200k_base; prompts are built from it


@dataclass
class Arrival:
    at: float  # seconds after start
    context: int
    generated: int


def read_trace(path: Path, duration: float, speedup: float, max_context: int,
               max_output: int, context_scale: float = 1.0) -> list[Arrival]:
    """The trace's first ``duration * speedup`` seconds, time-compressed by ``speedup``; each
    row's ContextTokens times ``context_scale`` (at least 16), capped at ``max_context``."""
    out: list[Arrival] = []
    t0: dt.datetime | None = None
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            t = dt.datetime.fromisoformat(row["TIMESTAMP"][:26])
            t0 = t0 or t
            at = (t - t0).total_seconds() / speedup
            if at >= duration:
                break
            context = max(16, round(int(row["ContextTokens"]) * context_scale))
            out.append(Arrival(at, min(context, max_context),
                               max(1, min(int(row["GeneratedTokens"]), max_output))))
    return out


@dataclass
class Results:
    ttft: list[float] = field(default_factory=list)
    interactive_errors: int = 0
    batch_tokens: int = 0
    batch_errors: int = 0
    #: what each failed request saw ("status 503", an exception's type), counted
    error_kinds: dict[str, int] = field(default_factory=dict)

    def failed(self, exc: Exception) -> None:
        kind = str(exc) if isinstance(exc, RuntimeError) else type(exc).__name__
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
    batch_done: int = 0


async def stream_chat(session: aiohttp.ClientSession, url: str, model: str, prompt_tokens: int,
                      max_tokens: int, headers: dict[str, str]) -> tuple[float | None, int]:
    """One streamed chat completion: (TTFT seconds, content chunks) or raises."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": WORD * max(1, prompt_tokens - 8)}]}
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
        async for line in r.content:
            content = b'"content":"' in line and b'"content":""' not in line
            if content and line.startswith(b"data: {"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    return ttft, chunks


async def run_load(url: str, arrivals: list[Arrival], duration: float, batch_workers: int,
                   batch_prompt: int, batch_output: int, with_batch: bool) -> Results:
    res = Results()
    headers = {"Authorization": f"Bearer {KEY}"}
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        start = time.perf_counter()
        stop_at = start + duration

        async def interactive(a: Arrival) -> None:
            delay = start + a.at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                ttft, _ = await stream_chat(session, url, "chat", a.context, a.generated,
                                            {**headers, "X-Request-Class": "interactive"})
                if ttft is not None:
                    res.ttft.append(ttft)
            except Exception as exc:
                res.interactive_errors += 1
                res.failed(exc)

        async def batch_worker() -> None:
            while time.perf_counter() < stop_at:
                try:
                    _, chunks = await stream_chat(session, url, "chat", batch_prompt,
                                                  batch_output,
                                                  {**headers, "X-Request-Class": "batch"})
                    if time.perf_counter() <= stop_at:
                        res.batch_tokens += chunks
                        res.batch_done += 1
                except Exception as exc:
                    res.batch_errors += 1
                    res.failed(exc)
                    await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(interactive(a)) for a in arrivals]
        workers = [asyncio.create_task(batch_worker()) for _ in range(batch_workers)] \
            if with_batch else []
        await asyncio.gather(*tasks)
        remaining = stop_at - time.perf_counter()
        if remaining > 0 and workers:
            await asyncio.sleep(remaining)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        res.batch_tokens = res.batch_tokens  # counted only for requests done within the window
    return res


def policy(scenario: str, interactive_url: str, batch_url: str, batch_cap: int,
           borrow_share: float, engine_keys: dict[str, Any] | None = None,
           interactive_cap: int = 32) -> dict[str, Any]:
    """The scenario's policy; ``engine_keys`` (:func:`pool_engine_keys`) go on every pool."""
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    keys = engine_keys or {}
    base: dict[str, Any] = {
        "auth": {"keys": [{"id": "bench", "sha256": sha, "allow_class_header": True}]},
        "classes": [{"name": "interactive", "priority": 0, "start_deadline": 30},
                    {"name": "batch", "priority": 10, "start_deadline": 600}],
    }
    inter = {"name": "sim-i", "url": interactive_url, "max_in_flight": interactive_cap}
    bat = {"name": "sim-b", "url": batch_url, "max_in_flight": batch_cap}
    if scenario == "b-round-robin":
        base["pools"] = [{"name": "all", "class": "interactive", "strategy": "round_robin",
                          "backends": [inter, bat], "queue_size": 100000, **keys}]
        base["models"] = [{"name": "chat", "pool": "all", "backend_model": "sim-model"}]
        return base
    ipool: dict[str, Any] = {"name": "interactive", "class": "interactive", "backends": [inter],
                             "queue_size": 100000, **keys}
    if scenario == "a-class":
        ipool["borrow"] = {"max_share": borrow_share, "ttft_p90_target": 0.5}
    base["pools"] = [ipool, {"name": "batch", "class": "batch", "backends": [bat],
                             "queue_size": 100000, **keys}]
    base["models"] = [{"name": "chat", "pool": "interactive", "pools": {"batch": "batch"},
                       "backend_model": "sim-model"}]
    return base


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def engine_specs(args: argparse.Namespace) -> list[EngineSpec]:
    """The interactive engine, then the batch one: the simulators' ``interactive`` and
    ``batch`` profiles as before (``--sim-profile`` replaces both, running batches then set to
    ``--interactive-cap`` and ``--batch-cap``), or llama-servers with those slots, each slot
    holding the longest request of the workload."""
    longest = max(args.max_context + args.max_output, args.batch_prompt + args.batch_output)
    per_slot = ctx_per_slot(longest)
    same = args.sim_profile is not None
    off = ("--no-prefix-caching",)  # prompts are one word repeated: every one would be a hit
    return [EngineSpec(profile="interactive", sim_args=off, slots=args.interactive_cap,
                       ctx_per_slot=per_slot, sim_slots=args.interactive_cap if same else None),
            EngineSpec(profile="batch", sim_args=off, slots=args.batch_cap,
                       ctx_per_slot=per_slot, sim_slots=args.batch_cap if same else None)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.routing_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure trace CSV")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per scenario (60)")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="trace time compression (1.0: the trace's own ~5.5 interactive "
                   "requests/s, about half of one interactive engine's capacity)")
    p.add_argument("--batch-workers", type=int, default=96, help="batch backlog size (96)")
    p.add_argument("--batch-cap", type=int, default=64,
                   help="max_in_flight of the batch backend (64; its llama-server's slots)")
    p.add_argument("--interactive-cap", type=int, default=32,
                   help="max_in_flight of the interactive backend (32; its llama-server's "
                   "slots)")
    p.add_argument("--context-scale", type=float, default=1.0,
                   help="the trace's ContextTokens times this (1)")
    p.add_argument("--max-context", type=int, default=8000,
                   help="interactive prompt tokens cap (8000)")
    p.add_argument("--max-output", type=int, default=1024,
                   help="interactive output tokens cap (1024)")
    p.add_argument("--batch-prompt", type=int, default=1000, help="batch prompt tokens (1000)")
    p.add_argument("--batch-output", type=int, default=256, help="batch output tokens (256)")
    p.add_argument("--borrow-share", type=float, default=0.25,
                   help="interactive pool share batch may borrow in a-class (0.25)")
    p.add_argument("--ttft-target", type=float, default=0.5, help="interactive TTFT target, s")
    p.add_argument("--scenarios", default="idle,a-class,b-round-robin,c-static")
    p.add_argument("--out", type=Path, default=ROOT / "loadtest/results/routing.json")
    add_engine_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.trace.exists():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2
    arrivals = read_trace(args.trace, args.duration, args.speedup, args.max_context,
                          args.max_output, args.context_scale)
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="routing-bench-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GATEWAY_ACCESS_LOG": "off"}
    load_before = os.getloadavg()
    fleet = start_fleet(engine_specs(args), args, env, tmp, _wait)
    keys = pool_engine_keys(args)
    try:
        sims = dict(zip(("interactive", "batch"), fleet.urls, strict=True))
        for scenario in args.scenarios.split(","):
            data = policy("c-static" if scenario == "idle" else scenario, sims["interactive"],
                          sims["batch"], args.batch_cap, args.borrow_share, keys,
                          args.interactive_cap)
            cfg = tmp / f"{scenario}.yaml"
            cfg.write_text(yaml.safe_dump(data))
            port = _free_port()
            gw = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(cfg),
                                   "--port", str(port)], env=env, stdout=subprocess.DEVNULL)
            try:
                _wait(f"http://127.0.0.1:{port}/healthz", gw)
                print(f"[routing-bench] {scenario}: {len(arrivals)} interactive arrivals over "
                      f"{args.duration:.0f}s" + ("" if scenario == "idle" else
                                                 f" + {args.batch_workers} batch workers"),
                      file=sys.stderr, flush=True)
                res = asyncio.run(run_load(f"http://127.0.0.1:{port}", arrivals, args.duration,
                                           args.batch_workers, args.batch_prompt,
                                           args.batch_output, scenario != "idle"))
            finally:
                gw.send_signal(signal.SIGTERM)
                gw.wait(30)
            ok = [t for t in res.ttft]
            rows.append({
                "scenario": scenario,
                "interactive_requests": len(arrivals),
                "ttft_p50_ms": pct(ok, 0.5) * 1000,
                "ttft_p99_ms": pct(ok, 0.99) * 1000,
                "attainment": sum(1 for t in ok if t <= args.ttft_target) / max(1, len(arrivals)),
                "interactive_errors": res.interactive_errors,
                "batch_tokens_per_s": res.batch_tokens / args.duration,
                "batch_requests": res.batch_done,
                "batch_errors": res.batch_errors,
                "error_kinds": res.error_kinds,
            })
            time.sleep(2)  # let the engines drain between scenarios
    finally:
        fleet.stop()
    load_after = os.getloadavg()
    by = {r["scenario"]: r for r in rows}
    print(f"\n{len(arrivals)} interactive requests over {args.duration:.0f} s; "
          + "; ".join(fleet.describe())
          + f"; load average {load_before[0]:.1f} -> {load_after[0]:.1f}")
    print(f"\n| scenario | interactive TTFT p50 ms | p99 ms | attainment (<= "
          f"{args.ttft_target * 1000:.0f} ms) | interactive errors | batch output tok/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['scenario']} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
              f"{100 * r['attainment']:.1f}% | {r['interactive_errors']} | "
              f"{r['batch_tokens_per_s']:,.0f} |")
    verdicts = []
    if {"idle", "a-class", "c-static"} <= by.keys():
        a, idle, c = by["a-class"], by["idle"], by["c-static"]
        ratio = a["ttft_p99_ms"] / idle["ttft_p99_ms"]
        verdicts.append((ratio <= 1.5, f"(a) TTFT p99 {ratio:.2f}x idle (target <= 1.5x)"))
        verdicts.append((a["attainment"] >= 0.99,
                         f"(a) attainment {100 * a['attainment']:.1f}% (target >= 99%)"))
        share = a["batch_tokens_per_s"] / max(1e-9, c["batch_tokens_per_s"])
        verdicts.append((share >= 1.0, f"(a) batch {100 * share:.0f}% of (c) (target >= 100%)"))
    if "b-round-robin" in by:
        b = by["b-round-robin"]
        verdicts.append((b["attainment"] < 0.99 or b["ttft_p99_ms"] > 1.5 * by.get(
            "idle", b)["ttft_p99_ms"], f"(b) misses the interactive target: p99 "
            f"{b['ttft_p99_ms']:.0f} ms, attainment {100 * b['attainment']:.1f}%"))
    print()
    for ok_, text in verdicts:
        print(f"- {'PASS' if ok_ else 'FAIL'} {text}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "load_average": [load_before, load_after],
                                    "args": {k: str(v) for k, v in vars(args).items()}},
                                   indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
