"""``python -m loadtest.bench.rollout_bench``: a progressive canary, time-compressed, good and bad.

Starts two fast simulators (``gateway sim --speedup``; the canary's with an injected fault)
and a gateway whose model splits into a baseline version and a progressive canary, drives
streamed chat requests at it, and samples ``/admin/rollouts`` and the answers every
``--sample`` seconds. Scenarios:

- ``good``: the canary is the same as the baseline: it should walk every step to promoted;
- ``errors``: the canary answers 5% of requests with a 500: rolled back at its first step;
- ``ttft``: the canary's first token comes 2x later (a 200 ms wall-clock stall against the
  baseline's 100 ms): rolled back.

Writes ``rollout-timeline.png`` (traffic share, error rate and TTFT p90 of the canary's and
the baseline's answers over time, one column per scenario), ``rollout-table.md`` (one row per
step of each scenario) and ``rollout-bench.json`` into ``--out``. Retries are off
(``max_attempts: 1``) so the chart shows what the canary's clients saw until the rollback.
Reports the load average, since the box is shared: read figures as same-run comparisons.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

from loadtest.bench.routing_bench import _free_port, _wait

__all__ = ["main"]

ADMIN_TOKEN = "rollout-bench-admin-token"
KEY = "sk-rollout-bench-0123456789abcdef0123456789"
SCENARIOS = {
    "good": [],
    "errors": ["--error-status", "500", "--error-rate", "0.05"],
    "ttft": ["--stall-ms", "200"],
}
#: every simulator waits this long before its first token (wall clock, not sped up), so the
#: TTFT fault doubles a TTFT that the box's own load does not swamp
BASE_STALL = ["--stall-ms", "100"]


def bench_policy(stable: str, canary: str, args: argparse.Namespace) -> dict[str, Any]:
    """The policy each scenario runs (printed in docs/benchmarks/rollouts.md with the chart)."""
    import hashlib

    return {
        "auth": {"keys": [{"id": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]},
        "routing": {"retry": {"max_attempts": 1}},
        "pools": [{"name": "stable", "backends": [{"url": stable, "max_in_flight": 512}]},
                  {"name": "canary", "backends": [{"url": canary, "max_in_flight": 512}]}],
        "models": [{
            "name": "chat", "pool": "stable", "sticky": "conversation",
            "versions": [
                {"name": "v1", "backend_model": "sim-model", "weight": 1, "pool": "stable"},
                {"name": "v2", "backend_model": "sim-model", "weight": 0, "pool": "canary",
                 "progressive": {"steps": args.steps, "hold": f"{args.hold}s",
                                 "min_requests": args.min_requests,
                                 "confidence": args.confidence,
                                 "gates": {"error_rate": {"max_increase": 0.01},
                                           "ttft_p90": {"max_ratio": 1.25},
                                           "tpot_p90": {"max_ratio": 1.25}}}}]}],
    }


@dataclass
class Sample:
    t: float
    phase: str
    share: float
    #: pool -> [requests, errors, ttfts]
    answers: dict[str, list[Any]] = field(default_factory=dict)


async def _client(session: aiohttp.ClientSession, url: str, i: int,
                  bucket: list[dict[str, list[Any]]], stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        started = time.perf_counter()
        pool, ok, ttft = "", False, None
        try:
            async with session.post(url + "/v1/chat/completions", json={
                    "model": "chat", "stream": True, "max_tokens": 16,
                    "user": f"user-{i}-{n % 50}",
                    "messages": [{"role": "user", "content": f"hi {i} {n}"}]},
                    headers={"Authorization": f"Bearer {KEY}"}) as answer:
                pool = answer.headers.get("x-gateway-pool", "")
                async for _chunk in answer.content.iter_any():
                    if ttft is None:
                        ttft = time.perf_counter() - started
                ok = answer.status == 200
        except aiohttp.ClientError:
            pass
        if not pool:
            pool = "canary"  # a 500 without a pool header came from the only failing one
        row = bucket[0].setdefault(pool, [0, 0, []])
        row[0] += 1
        row[1] += 0 if ok else 1
        if ok and ttft is not None:
            row[2].append(ttft)


def _admin(url: str) -> dict[str, Any]:
    request = urllib.request.Request(url + "/admin/rollouts/chat",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        data: dict[str, Any] = json.loads(answer.read())
        return data


async def run_scenario(url: str, args: argparse.Namespace) -> tuple[list[Sample], dict[str, Any]]:
    stop = asyncio.Event()
    bucket: list[dict[str, list[Any]]] = [{}]
    samples: list[Sample] = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        clients = [asyncio.create_task(_client(session, url, i, bucket, stop))
                   for i in range(args.concurrency)]
        view: dict[str, Any] = {}
        while time.monotonic() - t0 < args.max_seconds:
            await asyncio.sleep(args.sample)
            view = await asyncio.to_thread(_admin, url)
            answers, bucket[0] = bucket[0], {}
            samples.append(Sample(round(time.monotonic() - t0, 2), view["phase"],
                                  view["share"], answers))
            if view["phase"] in ("promoted", "rolled_back", "aborted") and samples[-1].t - next(
                    s.t for s in samples if s.phase == view["phase"]) >= args.tail:
                break
        stop.set()
        await asyncio.gather(*clients)
    return samples, view


def _p90(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def step_rows(name: str, samples: list[Sample]) -> list[dict[str, Any]]:
    """One row per (phase, share) run of samples."""
    rows: list[dict[str, Any]] = []
    for s in samples:
        if not rows or (rows[-1]["phase"], rows[-1]["share"]) != (s.phase, s.share):
            rows.append({"scenario": name, "phase": s.phase, "share": s.share,
                         "from_s": s.t, "to_s": s.t, "pools": {}})
        row = rows[-1]
        row["to_s"] = s.t
        for pool, (n, errors, ttfts) in s.answers.items():
            acc = row["pools"].setdefault(pool, [0, 0, []])
            acc[0] += n
            acc[1] += errors
            acc[2].extend(ttfts)
    return rows


def _fmt(row: dict[str, Any], pool: str) -> tuple[str, str, str]:
    n, errors, ttfts = row["pools"].get(pool, [0, 0, []])
    p90 = _p90(ttfts)
    return (str(n), f"{100 * errors / n:.1f}%" if n else "-",
            f"{1000 * p90:.0f}" if p90 is not None else "-")


def summarised(row: dict[str, Any]) -> dict[str, Any]:
    """A step's row with counts and p90s in place of every TTFT (for the JSON)."""
    pools = {}
    for pool, (n, errors, ttfts) in row["pools"].items():
        p90 = _p90(ttfts)
        pools[pool] = {"requests": n, "errors": errors,
                       "ttft_p90_ms": round(1000 * p90, 1) if p90 is not None else None}
    return {**row, "pools": pools}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| scenario | phase | canary share | from-to (s) | canary req | baseline req "
             "| canary errors | baseline errors | canary TTFT p90 ms | baseline TTFT p90 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cn, ce, ct = _fmt(r, "canary")
        bn, be, bt = _fmt(r, "stable")
        lines.append(f"| {r['scenario']} | {r['phase']} | {r['share']:g}% | "
                     f"{r['from_s']:.1f}-{r['to_s']:.1f} | {cn} | {bn} | {ce} | {be} | {ct} "
                     f"| {bt} |")
    return "\n".join(lines)


#: seconds of answers behind each point of the error and TTFT panels
ROLLING = 3.0
#: the first seconds (connections opening, first requests) are left out of the chart
WARMUP = 1.0


def _rolling(samples: list[Sample], t: float, pool: str) -> tuple[int, int, list[float]]:
    n, errors, ttfts = 0, 0, []
    for s in samples:
        if t - ROLLING < s.t <= t:
            row = s.answers.get(pool, [0, 0, []])
            n, errors = n + row[0], errors + row[1]
            ttfts += row[2]
    return n, errors, ttfts


def plot(runs: dict[str, list[Sample]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(runs), figsize=(4.2 * len(runs), 7.5), sharex="col",
                             squeeze=False)
    for col, (name, run) in enumerate(runs.items()):
        samples = [s for s in run if s.t >= WARMUP]
        t = [s.t for s in samples]
        share, served = axes[0][col], []
        for s in samples:
            total = sum(v[0] for v in s.answers.values())
            served.append(100 * s.answers.get("canary", [0])[0] / total if total else None)
        share.step(t, [s.share for s in samples], where="post", label="canary step (%)")
        share.plot(t, served, ".", markersize=3, label="canary answers (%)")
        share.set_title(f"{name} canary")
        share.set_ylim(-5, 105)
        for pool, style in (("canary", "-"), ("stable", "--")):
            errs, p90s = [], []
            for s in samples:
                n, e, ttfts = _rolling(samples, s.t, pool)
                errs.append(100 * e / n if n >= 5 else None)
                p = _p90(ttfts) if len(ttfts) >= 5 else None
                p90s.append(1000 * p if p is not None else None)
            axes[1][col].plot(t, errs, style, label=f"{pool} ({ROLLING:g} s rolling)")
            axes[2][col].plot(t, p90s, style, label=f"{pool} ({ROLLING:g} s rolling)")
        for ax, label in zip(axes[:, col], ("traffic share %", "error rate %",
                                             "TTFT p90 ms"), strict=True):
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        axes[2][col].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.rollout_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="good,errors,ttft")
    parser.add_argument("--steps", default="10,25,50,100",
                        type=lambda s: [float(x) for x in s.split(",")])
    parser.add_argument("--hold", type=float, default=3.0, help="seconds per step (min)")
    parser.add_argument("--min-requests", type=int, default=150)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--speedup", type=float, default=20.0, help="simulators' speed-up")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--tail", type=float, default=3.0,
                        help="seconds sampled after the rollout ends")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=Path("loadtest/docs"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GATEWAY_ACCESS_LOG": "off",
           "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
    env.pop("GATEWAY_REDIS_URL", None)
    tmp = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    runs: dict[str, list[Sample]] = {}
    rows: list[dict[str, Any]] = []
    finals: dict[str, Any] = {}
    load_before = os.getloadavg()
    for name in args.scenarios.split(","):
        procs: list[subprocess.Popen[bytes]] = []
        try:
            urls = []
            for faults in (BASE_STALL, BASE_STALL + SCENARIOS[name]):  # the last flag wins
                port = _free_port()
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gateway", "sim", "--port", str(port),
                     "--speedup", str(args.speedup), "--jitter", "0.05",
                     "--queue-limit", "100000", *faults], env=env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(proc)
                urls.append(f"http://127.0.0.1:{port}")
                _wait(urls[-1] + "/health", proc)
            data = bench_policy(urls[0], urls[1], args)
            data["store"] = {"data_dir": str(tmp / name), "spool_dir": str(tmp / f"{name}-sp")}
            cfg = tmp / f"{name}.yaml"
            cfg.write_text(yaml.safe_dump(data))
            port = _free_port()
            gw = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config",
                                   str(cfg), "--port", str(port)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(gw)
            url = f"http://127.0.0.1:{port}"
            _wait(url + "/healthz", gw)
            print(f"[rollout-bench] {name} ...", file=sys.stderr, flush=True)
            samples, final = asyncio.run(run_scenario(url, args))
            runs[name] = samples
            finals[name] = {"phase": final.get("phase"),
                            "history": [(e["reason"], e["at"]) for e in final.get("history", [])]}
            rows += step_rows(name, samples)
            print(f"[rollout-bench] {name}: {final.get('phase')} after "
                  f"{[e['reason'] for e in final.get('history', [])]}", file=sys.stderr)
        finally:
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    load_after = os.getloadavg()
    md = table(rows)
    (args.out / "rollout-table.md").write_text(md + "\n")
    plot(runs, args.out / "rollout-timeline.png")
    (args.out / "rollout-bench.json").write_text(json.dumps({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load_average": [load_before, load_after], "finals": finals,
        "steps": [summarised(r) for r in rows],
        "policy": bench_policy("http://stable-sim", "http://canary-sim", args)}, indent=1))
    print(md)
    print(f"\nload average before {load_before[0]:.1f}, after {load_after[0]:.1f}; "
          f"chart {args.out / 'rollout-timeline.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
