"""Noisy-neighbour benchmark: two tenants share an interactive pool; one floods it.

``python -m loadtest.bench.fairness_bench [--duration 30] [--engines 2] [--speedup 0.25]
[--scenarios b-alone,fair,...] [--engine sim|llamacpp]``

Against the same simulated interactive engines (``gateway sim``, one gateway process in front,
each backend's ``max_in_flight`` at the engine's running-batch size, so the queue is the
gateway's), one run measures the pool's capacity (a closed loop of tenant A alone) and then:

- ``b-alone``: tenant B alone at its normal rate (``--b-share`` of the capacity, open loop);
- ``fair``: B at the same rate beside tenant A sending ``--a-factor`` x its fair share (equal
  weights: half the capacity), fair queuing on (``fair: true``, the default) with
  ``fair_headroom: --headroom`` (2, the default: slots above each full backend's
  ``max_in_flight`` for a tenant below its share of the pool's slots), ``fair_stagger`` (the
  default: while B holds slots, A's requests start in bursts on one backend at a time, never
  where a request of B awaits its first chunk) and ``prefill_aware``
  (the default: of two backends, the one with fewer requests awaiting their first token, with
  as many the one whose pending requests were sent earlier);
- ``fair-no-linger``: the same with ``fair_linger: 0`` (A is staggered only while B holds
  slots, not also for the default 2 s after B's last request ended);
- ``fair-no-stagger``: the same with ``fair_stagger: false`` (A, above its share, starts on
  any backend with a free slot at once, instead of in bursts one backend at a time and never
  where a request of B awaits its first chunk);
- ``fair-no-prefill-aware``: the same with ``prefill_aware: false`` on the pool (backends
  picked by load and latency alone, not also by the prefills pending on them);
- ``fair-no-headroom``: the same with ``fair_headroom: 0`` (fair queuing alone: B's request,
  first in the queue, waits for the flood's next completion);
- ``fifo``: the same load with ``fair: false`` on the pool (one queue by deadline and
  arrival, the order before fair queuing);
- ``fair@H`` (any whole H, e.g. ``fair@2``): ``fair`` with ``fair_headroom: H``, so one run
  compares headroom sizes against the same ``b-alone``.

Every scenario starts a fresh gateway process (which loads its tokenizer at start-up, not on
the first request). B's requests come from a client process of their own, started at the
same instant as A's (``--one-client``: one process for both, whose event loop then also
parses A's ~750 chunks a second while it times B's first chunks). Arrivals are Poisson,
seeded, the same in every scenario. Reported per tenant: requests, the share answered 200,
TTFT p50/p99 of those, and output tokens served per second; and B's requests split by
whether another of B's was in flight when each was sent (with none, B holds no slot: the
case ``fair_linger`` is for). The targets (issue #18): B's TTFT
p99 under ``fair`` within 1.3x of ``b-alone`` (the p95 ratio is printed beside it: a p99 of a
few hundred requests is their few slowest, and moves between runs by more than most changes
do), and A still served at least its fair share; and a check that, once every client is done,
the gateway holds no backend slot (``gateway_inflight`` back to 0: a lost slot would shrink
the pool for good).
Prints a markdown table and writes JSON to ``loadtest/results/fairness.json``. Talks to the
gateway over HTTP only.

``--engine llamacpp`` runs it on ``--engines`` llama-servers instead
(:mod:`loadtest.bench.engine_fleet`: the tiny random llama at ``-t 1``, ``--engine-slots``
slots, default 32 as the ``interactive`` profile's running batch, so that, as with the
simulators, the gateway's ``max_in_flight`` plus ``fair_headroom`` never fills the engine and
the queue stays the gateway's; each slot holds the prompt and the longest output). The pool gets
``engine: llamacpp`` and keeps the default cache isolation, so the gateway sends ``cache_prompt:
false``: no prompt is reused, as the simulators run ``--no-prefix-caching``. ``--speedup``
applies to the simulators only; ``--sim-profile tiny-llamacpp --speedup 1`` runs the simulators
calibrated against that engine (``--engine-slots``, when given, sets their running batch too).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtest.bench.engine_fleet import (
    EngineSpec,
    add_engine_arguments,
    ctx_per_slot,
    pool_engine_keys,
    start_fleet,
)
from loadtest.bench.routing_bench import _free_port, _wait, pct

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"a": "sk-gw-fair-bench-a-0123456789abcdef0123456789abcdef",
        "b": "sk-gw-fair-bench-b-0123456789abcdef0123456789abcdef"}
WORD = " the"  # one token in o200k_base
METRICS_TOKEN = "fairness-bench-metrics"  # per-tenant series need a token on /metrics
SCENARIOS = ("b-alone", "fair", "fair-no-linger", "fair-no-stagger", "fair-no-prefill-aware",
             "fair-no-headroom", "fifo")


@dataclass
class Tenant:
    """What one tenant saw in one scenario."""

    sent: int = 0
    ok: int = 0
    refused: int = 0  # 503/429: the gateway could not start it in time
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    output_tokens: int = 0
    #: (sent, first chunk or None, done) of each request answered 200, ``perf_counter`` times
    #: (one clock for every process of the machine): what else the tenant had in flight
    spans: list[tuple[float, float | None, float]] = field(default_factory=list)


async def _one(session: aiohttp.ClientSession, url: str, tenant: str, prompt: int, output: int,
               out: Tenant, window_end: float) -> None:
    body = {"model": "chat", "stream": True, "max_tokens": output,
            "messages": [{"role": "user", "content": f"{tenant}:" + WORD * max(1, prompt - 8)}]}
    out.sent += 1
    t0 = time.perf_counter()
    ttft: float | None = None
    chunks = 0
    try:
        async with session.post(url + "/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {KEYS[tenant]}"}) as r:
            if r.status in (429, 503):
                out.refused += 1
                await r.read()
                return
            if r.status != 200:
                out.failed += 1
                await r.read()
                return
            async for line in r.content:
                if line.startswith(b"data: {") and b'"content":"' in line \
                        and b'"content":""' not in line:
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
    except (TimeoutError, aiohttp.ClientError):
        out.failed += 1
        return
    out.ok += 1
    if ttft is not None:
        out.ttft.append(ttft)
    out.spans.append((t0, None if ttft is None else t0 + ttft, time.perf_counter()))
    if time.perf_counter() <= window_end:
        out.output_tokens += chunks


def arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """Poisson arrival times in [0, duration)."""
    rng = random.Random(seed)
    at, out = 0.0, []
    while rate > 0:
        at += rng.expovariate(rate)
        if at >= duration:
            break
        out.append(at)
    return out


def output_length(mean: int, spread: float, tenant: str, index: int, seed: int) -> int:
    """Request ``index`` of ``tenant``'s output tokens: uniform in mean x [1 - spread,
    1 + spread], seeded (the same in every scenario). Equal lengths (spread 0) keep a
    saturated pool in lockstep: every slot frees in the same instant, every few seconds, so a
    newcomer waits for the next wave whatever the queue's order; real outputs vary."""
    if spread <= 0:
        return mean
    rng = random.Random(f"{seed}:{tenant}:{index}")
    low, high = max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))
    return rng.randint(low, high)


async def open_loop(url: str, plan: dict[str, list[float]], duration: float, prompt: int,
                    output: int, spread: float = 0.0, seed: int = 0,
                    start_at: float | None = None) -> tuple[dict[str, Tenant], list[float]]:
    """Each tenant's requests at their planned times (from ``start_at``, a ``time.time()``,
    else now); tokens counted inside the window. Also the round trips of ``GET /healthz``
    every 0.2 s: how late the gateway's (and this client's) event loop runs on a shared box,
    apart from any queue."""
    results = {t: Tenant() for t in plan}
    probes: list[float] = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        start = time.perf_counter()
        if start_at is not None:
            start += max(0.0, start_at - time.time())
        end = start + duration

        async def at(when: float, tenant: str, index: int) -> None:
            delay = start + when - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            length = output_length(output, spread, tenant, index, seed)
            await _one(session, url, tenant, prompt, length, results[tenant], end)

        async def probe() -> None:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                async with session.get(url + "/healthz") as r:
                    await r.read()
                probes.append(time.perf_counter() - t0)
                await asyncio.sleep(0.2)

        await asyncio.gather(probe(), *(at(w, t, i) for t, times in plan.items()
                                        for i, w in enumerate(times)))
    return results, probes


def _tenant_loop(url: str, plan: dict[str, list[float]], duration: float, prompt: int,
                 output: int, spread: float, seed: int, start_at: float) -> dict[str, Tenant]:
    """:func:`open_loop` in a process of its own (the entry point of :func:`split_loop`)."""
    return asyncio.run(open_loop(url, plan, duration, prompt, output, spread, seed,
                                 start_at))[0]


def split_loop(url: str, plan: dict[str, list[float]], duration: float, prompt: int,
               output: int, spread: float, seed: int, one_client: bool = False
               ) -> tuple[dict[str, Tenant], list[float]]:
    """:func:`open_loop`, with the tenants other than A in a client process of their own, both
    starting at the same instant: B's first-chunk times are then not taken on an event loop
    busy with A's flood (~750 chunks a second), a load the gateway is not the cause of.
    ``one_client``: every tenant in this process, as one loop."""
    others = {t: times for t, times in plan.items() if t != "a"}
    if one_client or "a" not in plan or not others:
        return asyncio.run(open_loop(url, plan, duration, prompt, output, spread, seed))
    start_at = time.time() + 3.0  # the child's start and imports
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        child = pool.submit(_tenant_loop, url, others, duration, prompt, output, spread, seed,
                            start_at)
        results, probes = asyncio.run(open_loop(url, {"a": plan["a"]}, duration, prompt,
                                                output, spread, seed, start_at))
        results.update(child.result())
    return results, probes


async def closed_loop(url: str, workers: int, duration: float, warmup: float, prompt: int,
                      output: int) -> float:
    """Requests per second tenant A completes with ``workers`` always waiting: the capacity."""
    done: list[float] = []  # completion times of requests answered 200
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        stop = time.perf_counter() + warmup + duration

        async def worker() -> None:
            sink = Tenant()
            while time.perf_counter() < stop:
                answered = sink.ok
                await _one(session, url, "a", prompt, output, sink, stop)
                if sink.ok > answered:
                    done.append(time.perf_counter())
                else:  # refused (the pool's queue is full or too long): back off a little
                    await asyncio.sleep(0.05)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
    counted = [t for t in done if t0 + warmup <= t <= t0 + warmup + duration]
    return len(counted) / duration


def _metrics(url: str) -> str:
    req = urllib.request.Request(url + "/metrics",
                                 headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def headroom_started(url: str) -> float:
    """Requests the pool started on its ``fair_headroom`` (``gateway_pool_headroom_dispatches``:
    the gateway reads it from the pool once a second)."""
    return _metric_sum(url, "gateway_pool_headroom_dispatches_total")


def _metric_sum(url: str, name: str) -> float:
    """The sum of one series' samples in the gateway's ``/metrics``."""
    return sum(s.value for family in text_string_to_metric_families(_metrics(url))
               for s in family.samples if s.name == name)


def slots_held(url: str, settle: float = 5.0) -> float:
    """Backend slots the gateway still counts in flight once every client is done
    (``gateway_inflight``, polled for up to ``settle`` s while the last requests end): 0
    unless the pool lost track of a slot, which would cost every tenant capacity for good."""
    end = time.monotonic() + settle
    while True:
        held = _metric_sum(url, "gateway_inflight")
        if held == 0 or time.monotonic() >= end:
            return held
        time.sleep(0.2)


def queue_waits(url: str) -> dict[str, dict[str, float]]:
    """Per tenant, from the gateway's ``gateway_tenant_queue_wait_seconds``: the mean wait
    and the p99 bucket's upper bound (the wait inside the gateway, apart from the engine's and
    the client's share of TTFT)."""
    text = _metrics(url)
    buckets: dict[str, list[tuple[float, float]]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            tenant = sample.labels.get("tenant", "")
            if sample.name == "gateway_tenant_queue_wait_seconds_bucket":
                buckets.setdefault(tenant, []).append((float(sample.labels["le"]), sample.value))
            elif sample.name == "gateway_tenant_queue_wait_seconds_sum":
                sums[tenant] = sample.value
            elif sample.name == "gateway_tenant_queue_wait_seconds_count":
                counts[tenant] = sample.value
    out = {}
    for tenant, count in counts.items():
        ordered = sorted(buckets.get(tenant, []))
        p99 = next((le for le, n in ordered if n >= 0.99 * count), float("inf"))
        out[tenant] = {"mean_ms": 1000 * sums.get(tenant, 0.0) / max(1.0, count),
                       "p99_le_ms": 1000 * p99}
    return out


def policy(backends: list[str], slots: int, fair: bool, deadline: float,
           headroom: int = 1, prefill_aware: bool = True, stagger: bool = True,
           linger: float | None = None, engine_keys: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    """The pool of ``backends``; ``engine_keys`` (:func:`pool_engine_keys`) go on it."""

    def sha(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return {
        "auth": {"keys": [{"id": f"key-{t}", "sha256": sha(k), "tenant": t}
                          for t, k in KEYS.items()]},
        "plans": [{"name": "standard", "weight": 1}],
        "tenants": [{"name": "a", "plan": "standard"}, {"name": "b", "plan": "standard"}],
        "classes": [{"name": "interactive", "priority": 0, "start_deadline": deadline},
                    {"name": "batch", "priority": 10, "start_deadline": 600}],
        "pools": [{"name": "shared", "class": "interactive", "fair": fair, "queue_size": 100000,
                   "fair_headroom": headroom, "prefill_aware": prefill_aware,
                   "fair_stagger": stagger,
                   **({} if linger is None else {"fair_linger": linger}),
                   **(engine_keys or {}),
                   "backends": [{"name": f"sim-{i}", "url": u, "max_in_flight": slots}
                                for i, u in enumerate(backends)]}],
        "models": [{"name": "chat", "pool": "shared", "backend_model": "sim-model"}],
    }


class Gateway:
    """``gateway serve`` on a policy, in a child process."""

    def __init__(self, tmp: Path, name: str, data: dict[str, Any], env: dict[str, str]) -> None:
        cfg = tmp / f"{name}.yaml"
        data = {**data, "store": {"data_dir": str(tmp / f"data-{name}"),
                                  "spool_dir": str(tmp / f"spool-{name}"),
                                  "ledger_durability": "buffered"}}
        cfg.write_text(yaml.safe_dump(data))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port",
             str(self.port)], env=env, stdout=subprocess.DEVNULL)

    def __enter__(self) -> Gateway:
        _wait(self.url + "/healthz", self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _row(scenario: str, tenant: str, t: Tenant, duration: float, total_tokens: int,
         wait: dict[str, float]) -> dict[str, Any]:
    return {
        "queue_wait_mean_ms": wait.get("mean_ms", float("nan")),
        "queue_wait_p99_le_ms": wait.get("p99_le_ms", float("nan")),
        "scenario": scenario, "tenant": tenant, "sent": t.sent, "ok": t.ok,
        "refused": t.refused, "failed": t.failed,
        "ok_share": t.ok / max(1, t.sent),
        "ttft_p50_ms": pct(t.ttft, 0.5) * 1000, "ttft_p95_ms": pct(t.ttft, 0.95) * 1000,
        "ttft_p99_ms": pct(t.ttft, 0.99) * 1000,
        "output_tok_s": t.output_tokens / duration,
        "served_share": t.output_tokens / max(1, total_tokens),
        **by_own_company(t.spans),
    }


def by_own_company(spans: list[tuple[float, float | None, float]]) -> dict[str, float]:
    """The tenant's requests split by whether another of its own was in flight when each was
    sent: their share and TTFT p50 / p99. A tenant with nothing in flight holds no slot; the
    pool keeps staggering the others for it only within its ``fair_linger``."""
    alone: list[float] = []
    company: list[float] = []
    latest = float("-inf")  # the latest end of the requests sent before this one
    for t0, first, end in sorted(spans):
        if first is not None:
            (company if latest > t0 else alone).append(first - t0)
        latest = max(latest, end)
    return {"sent_alone_share": len(alone) / max(1, len(alone) + len(company)),
            "sent_alone_ttft_p50_ms": pct(alone, 0.5) * 1000,
            "sent_alone_ttft_p99_ms": pct(alone, 0.99) * 1000,
            "sent_with_own_ttft_p50_ms": pct(company, 0.5) * 1000,
            "sent_with_own_ttft_p99_ms": pct(company, 0.99) * 1000}


def engine_specs(args: argparse.Namespace) -> list[EngineSpec]:
    """One spec per engine: the ``interactive`` simulator as before (``--sim-profile`` and
    ``--engine-slots`` replace its profile and running batch), or llama-server with
    ``--engine-slots`` slots (default 32) of the prompt plus the longest output each."""
    longest = args.prompt + round(args.output * (1 + max(0.0, args.output_spread)))
    return [EngineSpec(profile="interactive",
                       sim_args=("--speedup", str(args.speedup), "--seed", str(args.seed),
                                 # prompts are one word repeated: with prefix caching every
                                 # one would be a hit
                                 "--no-prefix-caching"),
                       slots=args.engine_slots or 32, ctx_per_slot=ctx_per_slot(longest),
                       sim_slots=args.engine_slots)
            for _ in range(args.engines)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.fairness_bench",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=30.0, help="seconds per scenario (30)")
    p.add_argument("--calibrate", type=float, default=6.0,
                   help="seconds measuring the capacity, after 3 s of warm-up (6)")
    p.add_argument("--engines", type=int, default=2, help="simulated engines in the pool (2)")
    p.add_argument("--slots", type=int, default=16,
                   help="max_in_flight per backend, at most the engine's running batch (32) so "
                   "the queue is the gateway's, not the engine's (16)")
    p.add_argument("--speedup", type=float, default=0.25,
                   help="engine time scale (0.25: modelled times x4, so fewer requests/s load "
                   "the 2-core box for the same queueing); simulators only")
    p.add_argument("--engine-slots", type=int, default=None,
                   help="each engine's running batch: llama-server -np (default 32, the "
                   "interactive profile's), and the simulators' --slots when given")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens (256)")
    p.add_argument("--output", type=int, default=64, help="mean output tokens (64)")
    p.add_argument("--output-spread", type=float, default=0.75,
                   help="each request's output tokens uniform in mean x [1 - s, 1 + s], seeded "
                   "(0.75); 0: every request the same length (a saturated pool then frees its "
                   "slots in lockstep waves)")
    p.add_argument("--capacity", type=float, default=None,
                   help="the pool's capacity in requests/s, instead of measuring it: the "
                   "rates (and so the arrivals) of another run, e.g. one on the other engine")
    p.add_argument("--b-share", type=float, default=0.15,
                   help="B's rate as a share of the measured capacity (0.15: well inside its "
                   "fair share of 0.5)")
    p.add_argument("--a-factor", type=float, default=5.0,
                   help="A's rate as a multiple of its fair share, half the capacity (5)")
    p.add_argument("--deadline", type=float, default=5.0,
                   help="the interactive class's start_deadline, s (5, the default class)")
    p.add_argument("--headroom", type=int, default=2,
                   help="the fair scenario's fair_headroom (2, the gateway's default); "
                   "fair-no-headroom runs with 0, fair@H with H")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated scenarios to run, in the order given; b-alone and fair "
                   f"are always among them (default: {','.join(SCENARIOS)})")
    p.add_argument("--one-client", action="store_true",
                   help="send both tenants' requests from one client process (by default B's "
                   "come from a process of its own, so A's flood does not slow the loop that "
                   "times B's first chunks)")
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--out", type=Path, default=ROOT / "loadtest/results/fairness.json")
    add_engine_arguments(p)
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(s for s in set(chosen) - set(SCENARIOS) if _headroom_of(s) is None)
    if unknown:
        p.error(f"unknown scenarios: {', '.join(unknown)}; known: {', '.join(SCENARIOS)}, fair@H")
    for needed in ("b-alone", "fair"):
        if needed not in chosen:
            chosen.insert(0 if needed == "b-alone" else 1, needed)
    args.chosen = chosen
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = args.chosen
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GATEWAY_ACCESS_LOG": "off",
           "GATEWAY_METRICS_TOKEN": METRICS_TOKEN}
    tmp = Path(tempfile.mkdtemp(prefix="fairness-bench-"))
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    fleet = start_fleet(engine_specs(args), args, env, tmp, _wait)
    keys = pool_engine_keys(args)
    try:
        urls = list(fleet.urls)
        if args.capacity:  # given: the same rates as another run (another engine's)
            capacity = args.capacity
        else:
            with Gateway(tmp, "calibrate", policy(urls, args.slots, True, args.deadline,
                                                  engine_keys=keys), env) as gw:
                capacity = asyncio.run(closed_loop(gw.url, 2 * args.slots * args.engines,
                                                   args.calibrate, 3.0, args.prompt,
                                                   args.output))
        rate_b = args.b_share * capacity
        rate_a = args.a_factor * capacity / 2
        print(f"[fairness-bench] capacity {capacity:.1f} req/s; B {rate_b:.1f} req/s, "
              f"A {rate_a:.1f} req/s; {args.duration:.0f} s per scenario", file=sys.stderr,
              flush=True)
        plan_b = arrivals(rate_b, args.duration, args.seed)
        plan_a = arrivals(rate_a, args.duration, args.seed + 1)
        both = {"a": plan_a, "b": plan_b}
        # fair, fair_headroom, prefill_aware, fair_stagger, fair_linger (None: the default)
        every = {"b-alone": (True, args.headroom, True, True, None, {"b": plan_b}),
                 "fair": (True, args.headroom, True, True, None, both),
                 "fair-no-linger": (True, args.headroom, True, True, 0.0, both),
                 "fair-no-stagger": (True, args.headroom, True, False, None, both),
                 "fair-no-prefill-aware": (True, args.headroom, False, True, None, both),
                 "fair-no-headroom": (True, 0, True, True, None, both),
                 "fifo": (False, 0, True, True, None, both)}
        for name in chosen:
            h = _headroom_of(name)
            fair, headroom, aware, stagger, linger, plan = (
                every[name] if h is None else (True, h, True, True, None, both))
            time.sleep(2)  # the engines drain between scenarios
            data = policy(urls, args.slots, fair, args.deadline, headroom, aware, stagger,
                          linger, keys)
            with Gateway(tmp, name, data, env) as gw:
                print(f"[fairness-bench] {name}", file=sys.stderr, flush=True)
                res, probes = split_loop(gw.url, plan, args.duration, args.prompt,
                                         args.output, args.output_spread, args.seed,
                                         args.one_client)
                waits = queue_waits(gw.url)
                time.sleep(1.2)  # the last second's headroom dispatches reach /metrics
                started = headroom_started(gw.url)
                held = slots_held(gw.url)
            total = sum(t.output_tokens for t in res.values())
            for tenant, t in res.items():
                rows.append(_row(name, tenant, t, args.duration, total, waits.get(tenant, {})))
                rows[-1]["healthz_p50_ms"] = pct(probes, 0.5) * 1000
                rows[-1]["healthz_p99_ms"] = pct(probes, 0.99) * 1000
                rows[-1]["headroom_dispatches"] = started  # the pool's, not the tenant's
                rows[-1]["slots_held_after"] = held  # the pool's: 0 unless a slot leaked
    finally:
        fleet.stop()
    load_after = os.getloadavg()
    report = summarise(rows, capacity, args)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "capacity_rps": capacity, "rate_a_rps": rate_a, "rate_b_rps": rate_b, "rows": rows,
        "loadavg_before": load_before, "loadavg_after": load_after,
        "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    print(f"{args.engines} engines: " + "; ".join(fleet.describe()))
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")
    return 0


def _headroom_of(name: str) -> int | None:
    """H of a ``fair@H`` scenario name; None for any other name."""
    head, _, h = name.partition("@")
    return int(h) if head == "fair" and h.isdigit() else None


def summarise(rows: list[dict[str, Any]], capacity: float, args: argparse.Namespace) -> str:
    """The markdown table and the verdicts."""
    lines = ["", "| scenario | tenant | requests | answered 200 | TTFT p50 ms | TTFT p99 ms | "
             "gateway queue wait mean / p99 ms | output tok/s | share of served tokens | "
             "/healthz p50 / p99 ms |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['tenant'].upper()} | {r['sent']} | "
            f"{100 * r['ok_share']:.1f}% | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
            f"{r['queue_wait_mean_ms']:.0f} / <= {r['queue_wait_p99_le_ms']:.0f} | "
            f"{r['output_tok_s']:,.0f} | {100 * r['served_share']:.1f}% | "
            f"{r['healthz_p50_ms']:.0f} / {r['healthz_p99_ms']:.0f} |")
    by = {(r["scenario"], r["tenant"]): r for r in rows}
    alone, fair = by[("b-alone", "b")], by[("fair", "b")]
    ratio = fair["ttft_p99_ms"] / alone["ttft_p99_ms"]
    # a p99 of a few hundred requests is their few slowest: the p95 ratio is the steadier read
    ratio_p95 = fair["ttft_p95_ms"] / alone["ttft_p95_ms"]
    others = []
    for name in dict.fromkeys(r["scenario"] for r in rows):
        if name in ("b-alone", "fair") or (name, "b") not in by:
            continue
        row = by[(name, "b")]
        others.append(f"{name} {row['ttft_p99_ms'] / alone['ttft_p99_ms']:.2f}x (queue wait "
                      f"mean {row['queue_wait_mean_ms']:.0f} ms, "
                      f"{100 * row['ok_share']:.1f}% of B answered)")
    a_fair = by[("fair", "a")]
    # A's fair share: half the pool's output tokens at capacity (equal weights)
    share_tok = capacity * args.output / 2
    lines += ["",
              f"- {'PASS' if ratio <= 1.3 else 'FAIL'} B's TTFT p99 with fair queuing "
              f"{ratio:.2f}x B alone (target <= 1.3x; p95 {ratio_p95:.2f}x; queue wait mean "
              f"{fair['queue_wait_mean_ms']:.0f} ms, {100 * fair['ok_share']:.1f}% of B "
              f"answered, {fair['headroom_dispatches']:.0f} requests started on the headroom, "
              f"B sent {fair['sent']}, A {a_fair['sent']})"
              + ("; " + "; ".join(others) if others else ""),
              f"- {'PASS' if a_fair['output_tok_s'] >= 0.9 * share_tok else 'FAIL'} A served "
              f"{a_fair['output_tok_s']:,.0f} output tok/s with fair queuing, its fair share is "
              f"{share_tok:,.0f} (half of capacity {capacity:.1f} req/s x {args.output})"]
    for name in ("b-alone", "fair"):
        row = by[(name, "b")]
        lines.append(
            f"- {name}: {100 * row['sent_alone_share']:.1f}% of B's requests were sent with "
            f"none of B's in flight (TTFT p50 / p99 {row['sent_alone_ttft_p50_ms']:.0f} / "
            f"{row['sent_alone_ttft_p99_ms']:.0f} ms; the rest "
            f"{row['sent_with_own_ttft_p50_ms']:.0f} / {row['sent_with_own_ttft_p99_ms']:.0f})")
    leaked = {r["scenario"]: r["slots_held_after"] for r in rows if r.get("slots_held_after")}
    lines.append(f"- {'FAIL' if leaked else 'PASS'} no backend slot held once every client "
                 "was done" + (": " + ", ".join(f"{k} {v:.0f}" for k, v in leaked.items())
                               if leaked else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
