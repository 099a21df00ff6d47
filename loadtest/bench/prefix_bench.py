"""Prefix routing benchmark: multi-turn chat on 4 simulated engines with prefix caching.

``python -m loadtest.bench.prefix_bench [--duration 15] [--rounds 2] [--rate 2] [--trace PATH]
[--engines 4] [--engine sim|llamacpp]``

One run compares four routing policies in front of the same four ``interactive`` simulators
(``gateway sim``, automatic prefix caching on) under the same offered load (the same arrival
times, conversations and sizes in every run):

- ``round_robin``: ``strategy: round_robin``;
- ``least_loaded``: the default (power of two choices on outstanding requests);
- ``affinity``: least loaded plus an ``affinity:`` block (conversation key, bounded load 1.25);
- ``prefix``: ``strategy: prefix`` (the prompt's chunk hashes, bounded load 1.25).

The simulators are started once and shared; each scenario has its own gateway. Every scenario
runs ``--rounds`` times, the order reversed each round (A B C D, D C B A), so that a change in
the box's other load falls on all of them alike; a run's prompts carry its scenario and round,
so no run hits blocks an earlier one cached (those, evictable, give way as LRU would).

The workload. 20 distinct ~1,500-token system prompts; conversations of 3-10 turns (uniform: the
trace has no conversation ids), each turn re-sending its whole history (system prompt, every
earlier user message and answer, the new user message). Arrivals, think times and sizes come
from the Azure LLM inference conversation trace (``../shared/data/azure-llm-inference-2023/``,
read from there, never copied): its rows from ``--skip`` seconds in, in time order and
time-compressed by ``--rate``, are the request arrivals; row ``i`` is dealt to conversation slot
``i mod --conversations``, so a conversation's think time between turns is the sum of that many
consecutive gaps of the trace (the inter-arrival time of one of N users sharing the trace's
stream). A slot whose conversation has used its turns starts a new one (a fresh system prompt
draw). A turn's new user text is ``--user-share`` (default 1) times the row's ContextTokens,
its answer the row's GeneratedTokens (capped at ``--max-output``); the client re-sends an answer
of that length as the assistant message. A turn whose previous answer is still streaming when
its row arrives is sent when it ends (a user reads before replying; counted as ``late``).

Measured: prompt tokens actually prefilled (the engines' ``vllm:prompt_tokens_total`` minus
``vllm:prefix_cache_hits_total``, from their /metrics), the cache hit rate (hits / queries),
TTFT p50 / p99 at the client (streamed, through the gateway), the engines' own TTFT (p50 from
their histogram, interpolated, and mean), and load imbalance: each engine's running + waiting
sampled every 0.2 s, time-averaged per engine, max / mean over the four (and the mean of each
sample's max / mean, noisier at low load). Prints a markdown table with the issue's targets
(prefix against least_loaded: >= 40% fewer prefilled tokens, >= 30% lower TTFT p50, imbalance
<= 1.25x) and writes JSON to ``loadtest/results/prefix.json``.

``--engine llamacpp`` runs the same on ``--engines`` llama-servers instead
(:mod:`loadtest.bench.engine_fleet`: the tiny random llama at ``-t 1``, ``-np --slots``, 32 by
default as the ``interactive`` profile's running batch, each slot's context the longest
conversation of the plan; llama.cpp's own prompt cache on, its RAM cache capped at 1 GiB). Its
pool gets ``engine: llamacpp`` and ``cache_isolation: shared`` (one tenant: the gateway would
otherwise send ``cache_prompt: false``). Prefilled and cached tokens come from ``llamacpp:
prompt_tokens_total`` (which excludes cached tokens) and
``llamacpp:prompt_tokens_cached_total``; load from ``llamacpp:requests_processing`` +
``requests_deferred``. llama.cpp has no TTFT histogram: its "engine TTFT" is the answers' own
``timings.prompt_ms`` (the prefill, without the time a request waited for a slot), p50 / mean.
``--sim-profile tiny-llamacpp`` runs the simulators calibrated against that engine (``--slots``
then sets their running batch too). On a 2-core box use ``--engines 2`` and a smaller workload
(docs/benchmarks/llamacpp.md, "Benchmarks on llama.cpp").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import datetime as dt
import hashlib
import json
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

from loadtest.bench.engine_fleet import (
    EngineSpec,
    Fleet,
    add_engine_arguments,
    ctx_per_slot,
    load,
    pool_engine_keys,
    prompt_counters,
    start_fleet,
)
from loadtest.bench.routing_bench import _free_port, _wait, pct

ROOT = Path(__file__).resolve().parents[2]
_TRACE = "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"
# ../shared beside the repository (a worktree one level deeper finds it one further up)
DEFAULT_TRACE = next((p / _TRACE for p in ROOT.parents if (p / _TRACE).exists()),
                     ROOT.parent / _TRACE)
KEY = "sk-gw-prefix-bench-0123456789abcdef0123456789abcdef"
WORD = " the"  # one token in o200k_base
SCENARIOS = ("round_robin", "least_loaded", "affinity", "prefix")


@dataclass
class Turn:
    at: float  # seconds after start: the trace row's (compressed) arrival
    slot: int
    user_tokens: int
    output_tokens: int


@dataclass
class Conversation:
    system: int
    turns: int
    messages: list[dict[str, str]] = field(default_factory=list)


def read_trace(path: Path, skip: float, duration: float, rate: float, user_share: float,
               max_output: int) -> list[Turn]:
    """The trace's rows from ``skip`` seconds in, arriving within ``duration`` seconds after
    compressing time ``rate``x."""
    out: list[Turn] = []
    t0: dt.datetime | None = None
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            t = dt.datetime.fromisoformat(row["TIMESTAMP"][:26])
            t0 = t0 or t
            at = ((t - t0).total_seconds() - skip) / rate
            if at < 0:
                continue
            if at >= duration:
                break
            out.append(Turn(at, i, max(8, int(int(row["ContextTokens"]) * user_share)),
                            max(1, min(int(row["GeneratedTokens"]), max_output))))
    return out


def system_prompt(k: int, tokens: int, salt: str) -> str:
    """System prompt ``k``; ``salt`` (the scenario and round) keeps runs from sharing caches."""
    return f"[{salt}] System prompt {k}: you are assistant {k}." + WORD * tokens


@dataclass
class Results:
    ttft: list[float] = field(default_factory=list)
    errors: int = 0
    late: int = 0
    requests: int = 0
    samples: list[list[float]] = field(default_factory=list)  # per sample: load per engine
    prefill_ms: list[float] = field(default_factory=list)  # llama.cpp's timings.prompt_ms


async def stream_chat(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
                      max_tokens: int, timings: list[float] | None = None) -> float | None:
    """One streamed chat completion; its TTFT in seconds, or raises. With ``timings`` (a
    llama.cpp backend), the answer's usage is asked for and its ``timings.prompt_ms`` kept."""
    body: dict[str, Any] = {"model": "chat", "stream": True, "max_tokens": max_tokens,
                            "messages": messages}
    if timings is not None:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    ttft = None
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {KEY}"}) as r:
        if r.status != 200:
            raise RuntimeError(f"status {r.status}: {(await r.read())[:200]!r}")
        async for line in r.content:
            if ttft is None and line.startswith(b"data: {") and b'"content":"' in line \
                    and b'"content":""' not in line:
                ttft = time.perf_counter() - t0
            elif timings is not None and b'"timings":{' in line and line.startswith(b"data: {"):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    timings.append(float(json.loads(line[6:])["timings"]["prompt_ms"]))
    return ttft


async def sample_load(session: aiohttp.ClientSession, sims: list[str], res: Results,
                      stop: asyncio.Event, engine: str = "sim") -> None:
    while not stop.is_set():
        row = []
        for url in sims:
            row.append(await load(session, url, engine))
        res.samples.append(row)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


def conversation_plan(turns: list[Turn], slots: int, seed: int, systems: int
                      ) -> list[tuple[Turn, Conversation, int]]:
    """Each turn's conversation and tag, drawn in arrival order: every scenario sends the
    same (a round's seed decides)."""
    rng = random.Random(seed)
    conversations: dict[int, Conversation] = {}
    plan: list[tuple[Turn, Conversation, int]] = []
    for turn in turns:
        slot = turn.slot % slots
        convo = conversations.get(slot)
        if convo is None or convo.turns == 0:
            convo = Conversation(rng.randrange(systems), rng.randint(3, 10))
            conversations[slot] = convo
        convo.turns -= 1
        plan.append((turn, convo, rng.getrandbits(32)))
    return plan


def longest_conversation(plan: list[tuple[Turn, Conversation, int]], system_tokens: int) -> int:
    """The most tokens one conversation of the plan holds: its system prompt, every turn's
    user message and answer (each with ~16 tokens of framing and tag), the last answer."""
    total: dict[int, int] = {}
    for turn, convo, _ in plan:
        total[id(convo)] = total.get(id(convo), system_tokens + 32) + turn.user_tokens \
            + turn.output_tokens + 32
    return max(total.values(), default=system_tokens + 32)


async def run_load(url: str, sims: list[str], turns: list[Turn], slots: int, seed: int,
                   system_tokens: int, systems: int, salt: str, engine: str = "sim") -> Results:
    res = Results()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    timings = res.prefill_ms if engine == "llamacpp" else None
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_load(session, sims, res, stop, engine))
        start = time.perf_counter()
        plan = conversation_plan(turns, slots, seed, systems)

        async def one(turn: Turn, convo: Conversation, tag: int, prev: asyncio.Event | None,
                      done: asyncio.Event) -> None:
            try:
                delay = start + turn.at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if prev is not None and not prev.is_set():
                    res.late += 1
                    await prev.wait()
                if not convo.messages:
                    convo.messages.append({"role": "system",
                                           "content": system_prompt(convo.system, system_tokens,
                                                                  salt)})
                convo.messages.append({"role": "user", "content": f"[{tag:08x}]"
                                       + WORD * turn.user_tokens})
                res.requests += 1
                try:
                    ttft = await stream_chat(session, url, list(convo.messages),
                                             turn.output_tokens, timings)
                    if ttft is not None:
                        res.ttft.append(ttft)
                except Exception:
                    res.errors += 1
                # the answer as the client re-sends it next turn (its length, not its words:
                # the engines cache prompt blocks only)
                convo.messages.append({"role": "assistant",
                                       "content": WORD * turn.output_tokens})
            finally:
                done.set()

        tasks = []
        last: dict[int, asyncio.Event] = {}
        for turn, convo, tag in plan:
            done = asyncio.Event()
            key = id(convo)
            tasks.append(asyncio.create_task(one(turn, convo, tag, last.get(key), done)))
            last[key] = done
        await asyncio.gather(*tasks)
        stop.set()
        await sampler
    return res


def warm_up(url: str, n: int) -> None:
    """A few requests (distinct prompts) so that first-use costs (the gateway's tokenizer load,
    connection set-up) are not measured; the metrics are read after them."""
    for i in range(2 * n):
        body = json.dumps({"model": "chat", "max_tokens": 2, "messages": [
            {"role": "user", "content": f"warm-up {i} {time.time()}" + WORD * 20}]}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={
            "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()


def scrape(url: str, engine: str = "sim") -> dict[str, float]:
    if engine == "llamacpp":
        return prompt_counters(url, engine)
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name = line.split("{", 1)[0]
        if name == "vllm:time_to_first_token_seconds_bucket":
            le = line.split('le="', 1)[1].split('"', 1)[0]
            key = f"ttft_le:{le}"
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        elif name in ("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total",
                    "vllm:prefix_cache_queries_total", "vllm:time_to_first_token_seconds_sum",
                    "vllm:time_to_first_token_seconds_count"):
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def policy(scenario: str, sims: list[str], bounded_load: float,
           engine_keys: dict[str, Any] | None = None) -> dict[str, Any]:
    """The scenario's policy; ``engine_keys`` go on the pool (:func:`pool_engine_keys`:
    ``engine: llamacpp`` and ``cache_isolation: shared`` for llama.cpp)."""
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    pool: dict[str, Any] = {
        "name": "chat", "class": "interactive", "queue_size": 100000,
        **(engine_keys or {}),
        "backends": [{"name": f"sim-{i}", "url": u, "max_in_flight": 64}
                     for i, u in enumerate(sims)],
    }
    if scenario == "round_robin":
        pool["strategy"] = "round_robin"
    elif scenario == "affinity":
        pool["affinity"] = {"bounded_load": bounded_load}
    elif scenario == "prefix":
        pool["strategy"] = "prefix"
        pool["prefix"] = {"bounded_load": bounded_load}
    return {
        "auth": {"keys": [{"id": "bench", "sha256": sha}]},
        "classes": [{"name": "interactive", "priority": 0, "start_deadline": 60}],
        "batch": {"run": False},
        "pools": [pool],
        "models": [{"name": "chat", "pool": "chat", "backend_model": "sim-model"}],
    }


def histogram_p50(deltas: dict[str, float]) -> float:
    """The median of a cumulative Prometheus histogram (``ttft_le:<bound>`` counts),
    interpolated linearly inside its bucket as ``histogram_quantile`` does."""
    bounds = sorted((float(k.split(":", 1)[1]), v) for k, v in deltas.items()
                    if k.startswith("ttft_le:"))
    if not bounds or bounds[-1][1] <= 0:
        return float("nan")
    half = bounds[-1][1] / 2
    lo, below = 0.0, 0.0
    for bound, count in bounds:
        if count >= half:
            if bound == float("inf"):
                return lo
            return lo + (bound - lo) * (half - below) / max(count - below, 1e-9)
        lo, below = bound, count
    return float("nan")


def imbalance(samples: list[list[float]]) -> tuple[float, float]:
    """(max / mean of the per-engine time-averaged load, mean over samples of max / mean)."""
    if not samples:
        return float("nan"), float("nan")
    n = len(samples[0])
    avg = [sum(s[i] for s in samples) / len(samples) for i in range(n)]
    mean = sum(avg) / n
    per_sample = [max(s) / (sum(s) / n) for s in samples if sum(s) > 0]
    return (max(avg) / mean if mean else float("nan"),
            sum(per_sample) / len(per_sample) if per_sample else float("nan"))


@dataclass
class Setup:
    """The engines (``--engines``), shared by every scenario, and a gateway per scenario."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    sims: list[str] = field(default_factory=list)
    gateways: dict[str, str] = field(default_factory=dict)
    fleet: Fleet | None = None


def engine_specs(args: argparse.Namespace, turns: list[Turn]) -> list[EngineSpec]:
    """One spec per engine: the ``interactive`` simulator (``--speedup``; ``--sim-profile``
    and ``--slots`` replace its profile and running batch, and with ``--sim-profile`` its KV
    cache is the llama-server's ``-c``), or llama-server with ``--slots`` slots (default 32,
    the interactive profile's batch), each slot holding the longest conversation of any
    round's plan."""
    longest = max(longest_conversation(
        conversation_plan(turns, args.conversations, args.seed + r, args.systems),
        args.system_tokens) for r in range(max(1, args.rounds)))
    slots = args.slots or 32
    per_slot = ctx_per_slot(longest, margin=128)
    sim_args: tuple[str, ...] = ("--speedup", str(args.speedup))
    if args.sim_profile:  # the KV cache (and so the prefix cache) of the llama-server it models
        sim_args += ("--kv-tokens", str(slots * per_slot))
    return [EngineSpec(profile="interactive", sim_args=sim_args, slots=slots,
                       ctx_per_slot=per_slot, sim_slots=args.slots)
            for _ in range(args.engines)]


def start(scenarios: list[str], args: argparse.Namespace, tmp: Path,
          env: dict[str, str], turns: list[Turn] | None = None) -> Setup:
    """Start the engines and one gateway per scenario, all at once; wait until all answer.

    The engines are shared: a run's prompts carry its scenario and round (``salt``), so no run
    hits blocks an earlier one cached, and those blocks, evictable, give way as LRU would."""
    setup = Setup()
    setup.fleet = start_fleet(engine_specs(args, turns or []), args, env, tmp,
                              lambda url, proc: _wait(url, proc, timeout=240))
    setup.sims = list(setup.fleet.urls)
    keys = pool_engine_keys(args, shared_cache=True)
    for scenario in scenarios:
        cfg = tmp / f"{scenario}.yaml"
        cfg.write_text(yaml.safe_dump(policy(scenario, setup.sims, args.bounded_load, keys)))
        port = _free_port()
        setup.procs.append(subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port",
             str(port)], env=env, stdout=subprocess.DEVNULL))
        setup.gateways[scenario] = f"http://127.0.0.1:{port}"
    urls = [u + "/healthz" for u in setup.gateways.values()]
    for url, proc in zip(urls, setup.procs, strict=True):
        _wait(url, proc, timeout=240)
    for url in setup.gateways.values():
        warm_up(url, len(setup.sims))
    return setup


def stop(setup: Setup) -> None:
    for proc in reversed(setup.procs):
        proc.send_signal(signal.SIGTERM)
    for proc in setup.procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if setup.fleet is not None:
        setup.fleet.stop()


def summarize(scenario: str, runs: list[tuple[Results, list[dict[str, float]],
                                              list[dict[str, float]], float]]) -> dict[str, Any]:
    """One scenario's figures over its rounds: (results, metrics before, after, seconds)."""

    def total(name: str) -> float:
        return sum(a.get(name, 0.0) - b.get(name, 0.0)
                   for _, before, after, _ in runs
                   for a, b in zip(after, before, strict=True))

    ttft = [t for res, *_ in runs for t in res.ttft]
    samples = [row for res, *_ in runs for row in res.samples]
    prefill_ms = [t for res, *_ in runs for t in res.prefill_ms]
    prompt = total("vllm:prompt_tokens_total")
    hits = total("vllm:prefix_cache_hits_total")
    queries = total("vllm:prefix_cache_queries_total")
    avg_imb, sample_imb = imbalance(samples)
    engine_ttft = total("vllm:time_to_first_token_seconds_sum") / max(
        1.0, total("vllm:time_to_first_token_seconds_count"))
    buckets = {k: total(k) for k in runs[0][2][0] if k.startswith("ttft_le:")} if runs else {}
    engine_p50 = histogram_p50(buckets)
    if prefill_ms:  # llama.cpp: no TTFT histogram; the answers' prefill times instead
        engine_p50 = pct(prefill_ms, 0.5) / 1000
        engine_ttft = sum(prefill_ms) / len(prefill_ms) / 1000
    return {
        "scenario": scenario,
        "rounds": len(runs),
        "requests": sum(res.requests for res, *_ in runs),
        "errors": sum(res.errors for res, *_ in runs),
        "late": sum(res.late for res, *_ in runs),
        "elapsed_s": sum(e for *_, e in runs),
        "prompt_tokens": prompt,
        "prefilled_tokens": prompt - hits,
        "cache_hit_rate": hits / queries if queries else float("nan"),
        "ttft_p50_ms": pct(ttft, 0.5) * 1000,
        "ttft_p99_ms": pct(ttft, 0.99) * 1000,
        "engine_ttft_mean_ms": engine_ttft * 1000,
        "engine_ttft_p50_ms": engine_p50 * 1000,
        "imbalance": avg_imb,
        "imbalance_per_sample": sample_imb,
        "mean_in_flight": (sum(map(sum, samples)) / len(samples) / len(samples[0])
                           if samples else float("nan")),
    }


def run_all(scenarios: list[str], args: argparse.Namespace, turns: list[Turn], tmp: Path,
            env: dict[str, str]) -> list[dict[str, Any]]:
    """Every scenario ``--rounds`` times, the order reversed each round (A B C D, D C B A, ...)
    so that a change in the box's other load falls on all of them alike."""
    setup = Setup()
    runs: dict[str, list[Any]] = {s: [] for s in scenarios}
    engine = args.engine
    try:
        setup = start(scenarios, args, tmp, env, turns)
        for r in range(args.rounds):
            for scenario in scenarios if r % 2 == 0 else scenarios[::-1]:
                print(f"[prefix-bench] round {r + 1}: {scenario}, {len(turns)} requests over "
                      f"{args.duration:.0f}s", file=sys.stderr, flush=True)
                before = [scrape(u, engine) for u in setup.sims]
                t0 = time.perf_counter()
                res = asyncio.run(run_load(
                    setup.gateways[scenario], setup.sims, turns, args.conversations,
                    args.seed + r, args.system_tokens, args.systems, f"{scenario}/{r}", engine))
                elapsed = time.perf_counter() - t0
                runs[scenario].append((res, before, [scrape(u, engine) for u in setup.sims],
                                       elapsed))
    finally:
        stop(setup)
    return [summarize(s, runs[s]) for s in scenarios]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.prefix_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure conversation trace")
    p.add_argument("--duration", type=float, default=15.0,
                   help="seconds of arrivals per run (15)")
    p.add_argument("--skip", type=float, default=120.0,
                   help="start this many trace seconds in (120: past its slow first minute)")
    p.add_argument("--rate", type=float, default=2.0,
                   help="trace time compression (2: ~11 requests/s, the trace's own is ~5.5)")
    p.add_argument("--conversations", type=int, default=24,
                   help="concurrent conversation slots the trace is dealt to (24: ~2.3 s mean "
                   "between turns at --rate 2)")
    p.add_argument("--systems", type=int, default=20, help="distinct system prompts (20)")
    p.add_argument("--system-tokens", type=int, default=1500, help="system prompt tokens (1500)")
    p.add_argument("--user-share", type=float, default=1.0,
                   help="a turn's new user tokens as a share of the row's ContextTokens (1)")
    p.add_argument("--max-output", type=int, default=256, help="output tokens cap (256)")
    p.add_argument("--bounded-load", type=float, default=1.25, help="affinity and prefix (1.25)")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="simulators' --speedup (1; not used with --engine llamacpp)")
    p.add_argument("--engines", type=int, default=4, help="engines behind the pool (4)")
    p.add_argument("--slots", type=int, default=None,
                   help="each engine's running batch: llama-server -np (default 32, the "
                   "interactive profile's), and the simulators' --slots when given")
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--rounds", type=int, default=2,
                   help="runs of every scenario, in alternating order (2)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--out", type=Path, default=ROOT / "loadtest/results/prefix.json")
    add_engine_arguments(p)
    args = p.parse_args(argv)
    if args.engines < 1:
        p.error("--engines: at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.trace.exists():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2
    turns = read_trace(args.trace, args.skip, args.duration, args.rate, args.user_share,
                       args.max_output)
    tmp = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GATEWAY_ACCESS_LOG": "off"}
    load_before = os.getloadavg()
    rows = run_all(args.scenarios.split(","), args, turns, tmp, env)
    load_after = os.getloadavg()
    what = (f"{args.engines} llama-servers" if args.engine == "llamacpp" else
            f"{args.engines} simulators ({args.sim_profile or 'interactive'})")
    print(f"\n{len(turns)} requests over {args.duration:.0f} s (trace x{args.rate:g}), "
          f"{args.conversations} conversation slots, {what}, load average "
          f"{load_before[0]:.1f} -> {load_after[0]:.1f}\n")
    print("| routing | prefilled tokens | cache hit rate | TTFT p50 ms | TTFT p99 ms | "
          "engine TTFT p50 / mean ms | imbalance (max/mean, time-avg) | per sample | "
          "mean in-flight | late | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['scenario']} | {r['prefilled_tokens']:,.0f} | "
              f"{100 * r['cache_hit_rate']:.1f}% | {r['ttft_p50_ms']:.0f} | "
              f"{r['ttft_p99_ms']:.0f} | "
              f"{r['engine_ttft_p50_ms']:.0f} / {r['engine_ttft_mean_ms']:.0f} | "
              f"{r['imbalance']:.2f} | "
              f"{r['imbalance_per_sample']:.2f} | "
              f"{r['mean_in_flight']:.1f} | {r['late']} | {r['errors']} |")
    by = {r["scenario"]: r for r in rows}
    verdicts: list[tuple[bool, str]] = []
    if {"prefix", "least_loaded"} <= by.keys():
        pr, ll = by["prefix"], by["least_loaded"]
        fewer = 1 - pr["prefilled_tokens"] / ll["prefilled_tokens"]
        faster = 1 - pr["ttft_p50_ms"] / ll["ttft_p50_ms"]
        verdicts.append((fewer >= 0.40, f"prefilled tokens {100 * fewer:.0f}% fewer than "
                         "least_loaded (target >= 40%)"))
        verdicts.append((faster >= 0.30, f"TTFT p50 {100 * faster:.0f}% lower than least_loaded "
                         "(target >= 30%)"))
        engine = 1 - pr["engine_ttft_p50_ms"] / ll["engine_ttft_p50_ms"]
        verdicts.append((engine >= 0.30, f"engine-side TTFT p50 {100 * engine:.0f}% lower than "
                         "least_loaded (the engines' histogram, without the gateway and client "
                         "hops; same target)"))
        verdicts.append((pr["imbalance"] <= 1.25, f"imbalance {pr['imbalance']:.2f}x "
                         "(target <= 1.25x)"))
    print()
    for ok, text in verdicts:
        print(f"- {'PASS' if ok else 'FAIL'} {text}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "rows": rows, "load_average": [load_before, load_after],
        "verdicts": [{"pass": ok, "text": text} for ok, text in verdicts],
        "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
