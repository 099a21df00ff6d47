"""The latency shape of one engine: TTFT against prompt length, TPOT against concurrent streams.

``python -m loadtest.bench.engine_shape [--engine llamacpp|sim|both] [--slots 16]``

Talks to the engine directly (no gateway), over streamed chat completions:

- **TTFT vs prompt**: one request at a time (``--reps`` each, distinct prompts, prompt caching
  off: llama.cpp's ``cache_prompt: false``, the simulator's ``--no-prefix-caching``),
  ``max_tokens`` 1; the client's time to the first content chunk;
- **TPOT vs batch**: N streams started together (``--tpot-prompt`` tokens, ``--tpot-output``
  tokens each); a stream's TPOT is (last chunk - first chunk) / (chunks - 1), the median over
  the streams is reported with the output tokens per second of all of them;
- **TPOT vs context**: one stream, prompts of ``--ctx-lengths`` tokens.

Then it fits the simulator's step-cost model (``gateway/sim/profiles.py``): TTFT(P) = e + a +
P/R + q*P^2 (least squares) and TPOT(N) = a + c*N (+ d per 1,000 context tokens, from the
context curve), and prints the fitted constants beside the profile's. ``--engine both`` runs
llama.cpp, then the simulator with ``--sim-profile`` (``tiny-llamacpp``) and the same slots,
and prints the two side by side. JSON goes to ``loadtest/results/engine-shape.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.bench.engine_fleet import (
    MODEL_ALIAS,
    EngineSpec,
    add_engine_arguments,
    ctx_per_slot,
    start_fleet,
    wait_http,
)

ROOT = Path(__file__).resolve().parents[2]
WORD = " the"  # one token in GPT-2 and in o200k_base


def _body(prompt: int, output: int, engine: str) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    body: dict[str, Any] = {
        "model": MODEL_ALIAS, "stream": True, "max_tokens": output,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"[{tag}]" + WORD * max(1, prompt - 16)}]}
    if engine == "llamacpp":
        body["cache_prompt"] = False
    return body


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                 usage: dict[str, Any] | None = None) -> tuple[float, list[float]]:
    """(TTFT, the arrival time of every content chunk after the start), seconds; the answer's
    ``usage`` into ``usage`` when given."""
    t0 = time.perf_counter()
    times: list[float] = []
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"status {r.status}: {(await r.read())[:200]!r}")
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content":"' in line \
                    and b'"content":""' not in line:
                times.append(time.perf_counter() - t0)
            elif usage is not None and line.startswith(b"data: {") and b'"usage":{' in line:
                usage.update(json.loads(line[6:])["usage"])
    if not times:  # a token that is part of a UTF-8 character is held back by llama.cpp
        times.append(time.perf_counter() - t0)
    return times[0], times


async def ttft_curve(url: str, engine: str, lengths: list[int], reps: int,
                     pid: int | None) -> list[dict[str, float]]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                     connector=aiohttp.TCPConnector(force_close=True)) as session:
        await stream(session, url, _body(64, 2, engine))  # first-use costs
        for n in lengths:
            got, cpus = [], []
            usage: dict[str, Any] = {}
            for _ in range(reps):
                cpu0 = cpu_seconds(pid)
                ttft, _ = await stream(session, url, _body(n, 1, engine), usage)
                got.append(ttft)
                cpus.append(cpu_seconds(pid) - cpu0)
                await asyncio.sleep(0.02)
            # the best of reps: the least disturbed by the box's other load
            out.append({"prompt": n, "tokens": usage.get("prompt_tokens", n),
                        "ttft_ms": 1000 * min(got),
                        "ttft_median_ms": 1000 * statistics.median(got),
                        "cpu_ms": 1000 * statistics.median(cpus) if pid else float("nan")})
    return out


def cpu_seconds(pid: int | None) -> float:
    """CPU time of every thread of process ``pid`` (``/proc/PID/task/*/schedstat``, in ns:
    finer than ``stat``'s clock ticks); 0 without a pid."""
    if pid is None:
        return 0.0
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


async def tpot_point(session: aiohttp.ClientSession, url: str, engine: str, n: int,
                     prompt: int, output: int, reps: int, pid: int | None
                     ) -> dict[str, float]:
    """The best (least disturbed by the box's other load) of ``reps`` runs of N streams."""
    best: dict[str, float] = {}
    for _ in range(reps):
        t0, cpu0 = time.perf_counter(), cpu_seconds(pid)
        usage: dict[str, Any] = {}
        runs = await asyncio.gather(*(stream(session, url, _body(prompt, output, engine), usage)
                                      for _ in range(n)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        tpots = [(t[-1] - t[0]) / (len(t) - 1) for _, t in runs if len(t) > 1]
        got = {"streams": n, "prompt": prompt, "tokens": usage.get("prompt_tokens", prompt),
               "tpot_ms": 1000 * statistics.median(tpots),
               "ttft_ms": 1000 * statistics.median(f for f, _ in runs),
               "out_tok_s": sum(len(t) for _, t in runs) / wall,
               # the engine's CPU time per decode step (prefills included, all N streams)
               "cpu_ms_per_step": 1000 * cpu / output if pid is not None else float("nan")}
        if not best or got["tpot_ms"] < best["tpot_ms"]:
            best = got
        await asyncio.sleep(0.2)
    return best


async def tpot_curve(url: str, engine: str, batches: list[int], prompt: int, output: int,
                     ctx_lengths: list[int], reps: int, pid: int | None
                     ) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    by_n, by_ctx = [], []
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=conn) as session:
        for n in batches:
            by_n.append(await tpot_point(session, url, engine, n, prompt, output, reps, pid))
        for c in ctx_lengths:
            by_ctx.append(await tpot_point(session, url, engine, 1, c, output, reps, pid))
    return by_n, by_ctx


def lstsq(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Ordinary least squares (normal equations; a few columns only)."""
    k = len(xs[0])
    a = [[sum(r[i] * r[j] for r in xs) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(xs, ys, strict=True)) for i in range(k)]
    for i in range(k):  # Gauss-Jordan
        p = max(range(i, k), key=lambda r: abs(a[r][i]))
        a[i], a[p], b[i], b[p] = a[p], a[i], b[p], b[i]
        for r in range(k):
            if r != i and a[i][i]:
                f = a[r][i] / a[i][i]
                a[r] = [x - f * y for x, y in zip(a[r], a[i], strict=True)]
                b[r] -= f * b[i]
    return [b[i] / a[i][i] if a[i][i] else 0.0 for i in range(k)]


def fit(ttft: list[dict[str, float]], by_n: list[dict[str, float]],
        by_ctx: list[dict[str, float]], output: int, cpu: bool = False) -> dict[str, float]:
    """The step-cost constants that reproduce the curves: the client's times (best of the
    reps), or with ``cpu`` the engine's CPU time (what it would take on a core of its own).

    Idle TTFT(P) = e + a + P/R + q*P^2 (P the prompt's tokens as the engine counted them);
    a step of N streams = a + c*N + d*N*ctx/1000 (ctx their mean context); one stream's step
    against its context gives d. In CPU time a run's steps also carry its N prefills, taken
    out with the TTFT fit."""
    key = "cpu_ms" if cpu else "ttft_ms"
    base, per_token, quad = lstsq([[1.0, p["tokens"], p["tokens"] ** 2] for p in ttft],
                                  [p[key] for p in ttft])

    def prefill(tokens: float) -> float:
        return base + per_token * tokens + quad * tokens * tokens

    def step(p: dict[str, float]) -> float:
        if not cpu:
            return p["tpot_ms"]
        tokens = p.get("tokens", p["prompt"])
        return p["cpu_ms_per_step"] - p["streams"] * prefill(tokens) / output

    d = 0.0
    if len(by_ctx) >= 2:
        _, d = lstsq([[1.0, (p.get("tokens", p["prompt"]) + output / 2) / 1000]
                      for p in by_ctx], [step(p) for p in by_ctx])
        d = max(0.0, d)
    a, c_eff = lstsq([[1.0, p["streams"]] for p in by_n], [step(p) for p in by_n])
    ctx = (by_n[0].get("tokens", by_n[0]["prompt"]) + output / 2) / 1000 if by_n else 0.0
    return {"step_ms": a, "per_seq_ms": c_eff - d * ctx, "per_kctx_ms": d,
            "prefill_tokens_per_ms": 1 / per_token if per_token > 0 else float("inf"),
            "attn_quadratic_ms": max(0.0, quad), "request_overhead_ms": base - a}


def measure(url: str, engine: str, args: argparse.Namespace, pid: int | None = None
            ) -> dict[str, Any]:
    lengths = [int(x) for x in args.prompts.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    ctxs = [int(x) for x in args.ctx_lengths.split(",") if x]
    print(f"[shape] {engine}: TTFT vs prompt {lengths}", file=sys.stderr, flush=True)
    ttft = asyncio.run(ttft_curve(url, engine, lengths, args.reps, pid))
    print(f"[shape] {engine}: TPOT vs streams {batches}, vs context {ctxs}", file=sys.stderr,
          flush=True)
    by_n, by_ctx = asyncio.run(tpot_curve(url, engine, batches, args.tpot_prompt,
                                          args.tpot_output, ctxs, args.tpot_reps, pid))
    out = {"ttft": ttft, "tpot": by_n, "tpot_ctx": by_ctx,
           "fit": fit(ttft, by_n, by_ctx, args.tpot_output)}
    if pid is not None:
        out["fit_cpu"] = fit(ttft, by_n, by_ctx, args.tpot_output, cpu=True)
    return out


def tables(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    cpu = [n for n in names if n.startswith("llama")]
    head = " | ".join(f"{n} TTFT ms" for n in names)
    head += "".join(f" | {n} CPU ms" for n in cpu)
    lines = [f"| prompt tokens (as counted) | {head} |",
             "|---:|" + "---:|" * (len(names) + len(cpu))]
    first = results[names[0]]
    for i, p in enumerate(first["ttft"]):
        lines.append(f"| {p['prompt']} ({p['tokens']}) | " + " | ".join(
            f"{results[n]['ttft'][i]['ttft_ms']:.1f}" for n in names) + "".join(
            f" | {results[n]['ttft'][i]['cpu_ms']:.1f}" for n in cpu) + " |")
    head = " | ".join(f"{n} TPOT ms / out tok/s" for n in names)
    head += "".join(f" | {n} CPU ms per step" for n in cpu)
    lines += ["", f"| streams | {head} |", "|---:|" + "---:|" * (len(names) + len(cpu))]
    for i, p in enumerate(first["tpot"]):
        lines.append(f"| {p['streams']} | " + " | ".join(
            f"{results[n]['tpot'][i]['tpot_ms']:.2f} / {results[n]['tpot'][i]['out_tok_s']:,.0f}"
            for n in names) + "".join(
            f" | {results[n]['tpot'][i]['cpu_ms_per_step']:.2f}" for n in cpu) + " |")
    if first["tpot_ctx"]:
        head = " | ".join(f"{n} TPOT ms" for n in names)
        lines += ["", f"| 1 stream, prompt tokens | {head} |", "|---:|" + "---:|" * len(names)]
        for i, p in enumerate(first["tpot_ctx"]):
            lines.append(f"| {p['prompt']} | " + " | ".join(
                f"{results[n]['tpot_ctx'][i]['tpot_ms']:.2f}" for n in names) + " |")
    fits = [(n, "fit") for n in names] + [(n, "fit_cpu") for n in names
                                          if "fit_cpu" in results[n]]
    lines += ["", "| fitted | " + " | ".join(
        n + (" (CPU time)" if f == "fit_cpu" else "") for n, f in fits) + " |",
        "|---|" + "---:|" * len(fits)]
    for k in first["fit"]:
        lines.append(f"| {k} | " + " | ".join(f"{results[n][f][k]:.4g}" for n, f in fits)
                     + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.engine_shape", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_arguments(p)
    for action in p._actions:
        if action.dest == "engine":
            action.choices = ("sim", "llamacpp", "both")
            action.help = "llamacpp, sim, or both (the default): llama.cpp, then the simulators"
        elif action.dest == "sim_profile":
            action.help = ("the simulator profiles to run, comma-separated (default "
                           "tiny-llamacpp,interactive)")
    p.set_defaults(engine="both", sim_profile="tiny-llamacpp,interactive")
    p.add_argument("--slots", type=int, default=16, help="engine slots (-np; sim --slots)")
    p.add_argument("--prompts", default="32,64,128,256,512,768,1024,1536,2048,3072",
                   help="prompt lengths of the TTFT curve")
    p.add_argument("--reps", type=int, default=7, help="requests per prompt length (7)")
    p.add_argument("--batches", default="1,2,4,8,16,32",
                   help="concurrent streams of the TPOT curve (at most --slots run at once)")
    p.add_argument("--tpot-reps", type=int, default=3,
                   help="runs of each TPOT point; the best is kept (3)")
    p.add_argument("--tpot-prompt", type=int, default=64, help="prompt tokens per stream (64)")
    p.add_argument("--tpot-output", type=int, default=64, help="output tokens per stream (64)")
    p.add_argument("--ctx-lengths", default="64,1024,2048,3072",
                   help="prompt lengths of the TPOT-vs-context curve (one stream)")
    p.add_argument("--out", type=Path, default=ROOT / "loadtest/results/engine-shape.json")
    args = p.parse_args(argv)
    longest = max([int(x) for x in args.prompts.split(",")]
                  + [int(x) for x in args.ctx_lengths.split(",") if x])
    per_slot = ctx_per_slot(longest + args.tpot_output)
    profiles = [x.strip() for x in (args.sim_profile or "tiny-llamacpp").split(",") if x.strip()]
    runs = ([("llamacpp", "")] if args.engine in ("llamacpp", "both") else []) + (
        [("sim", prof) for prof in profiles] if args.engine in ("sim", "both") else [])
    tmp = Path(tempfile.mkdtemp(prefix="engine-shape-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    results: dict[str, dict[str, Any]] = {}
    load_before = os.getloadavg()
    for engine, profile in runs:
        spec = EngineSpec(profile=profile or "tiny-llamacpp",
                          sim_args=("--no-prefix-caching", "--kv-tokens",
                                    str(args.slots * per_slot)),
                          slots=args.slots, ctx_per_slot=per_slot, sim_slots=args.slots)
        ns = argparse.Namespace(**{**vars(args), "engine": engine, "sim_profile": None})
        fleet = start_fleet([spec], ns, env, tmp, lambda url, proc: wait_http(url, proc))
        try:
            name = "llama.cpp" if engine == "llamacpp" else f"sim {profile}"
            pid = fleet.servers[0].proc.pid if fleet.servers else None
            results[name] = measure(fleet.urls[0], engine, args, pid)
        finally:
            fleet.stop()
    load_after = os.getloadavg()
    print(tables(results))
    print(f"\nload average {load_before[0]:.1f} -> {load_after[0]:.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results, "load_average": [load_before,
                                                                          load_after],
                                    "args": {k: str(v) for k, v in vars(args).items()}},
                                   indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
