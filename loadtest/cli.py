"""``python -m loadtest``: probe, sweep (and soak), cost, replay, compare; engine (a local one).

Each subcommand parses its options into the settings objects of its module, runs it on one
uvloop event loop, prints rich tables, and optionally writes ``--json FILE`` and ``--plot DIR``.
Exit status: 0 on success (probe: all checks passed), 1 when a probe check fails or a run saw
errors with ``--fail-on-errors``, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from loadtest.client import Target, base_url, list_models
from loadtest.cost import EXAMPLE, CostInputs, estimate
from loadtest.probe import DEFAULT_PROMPT, run_probe
from loadtest.replay import ReplayPlan, parse_targets, run_replay
from loadtest.sweep import SweepPlan, SweepResult, run_sweep
from loadtest.workload import Workload

__all__ = ["UsageError", "build_parser", "main"]

T = TypeVar("T")
EXAMPLE_SWEEP = Path(__file__).parent / "docs" / "example-sweep.json"
DEFAULT_URL = "http://127.0.0.1:8080"


class UsageError(Exception):
    """What the user must change (a missing key, an unreachable URL): one line and exit 2,
    never a traceback."""


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> None, dataclasses -> dicts."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _clean(dataclasses.asdict(value))
    return value


def write_json(path: str, data: dict[str, Any]) -> None:
    text = json.dumps(_clean(data), indent=2)
    if path == "-":
        print(text)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text + "\n")


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"levels must be integers: {text!r}") from exc
    if not levels or any(c < 1 for c in levels) or list(levels) != sorted(set(levels)):
        raise argparse.ArgumentTypeError("levels must be increasing positive integers")
    return levels


def _duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` -> seconds."""
    text = text.strip().lower()
    for suffix, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * mult
    return float(text)


# --- option groups ------------------------------------------------------------------------


def _add_target(p: argparse.ArgumentParser, prefix: str = "", name: str = "") -> None:
    dash = f"--{prefix}-" if prefix else "--"
    who = f" of endpoint {name}" if name else ""
    p.add_argument(
        f"{dash}url",
        default=DEFAULT_URL if not prefix else None,
        required=bool(prefix),
        help=f"base URL{who}, with or without /v1 (default {DEFAULT_URL})"
        if not prefix
        else f"base URL{who}, with or without /v1",
    )
    p.add_argument(
        f"{dash}model",
        default=None,
        help=f"model name{who} (default: the first one GET /v1/models lists)",
    )
    p.add_argument(
        f"{dash}api-key", default=None, help=f"bearer token{who} (default: env OPENAI_API_KEY)"
    )
    p.add_argument(f"{dash}label", default=name or "", help=f"name{who} in tables and charts")


def _add_output(p: argparse.ArgumentParser, plot: bool = True) -> None:
    p.add_argument("--json", metavar="FILE", help="write the full result as JSON ('-': stdout)")
    if plot:
        p.add_argument("--plot", metavar="DIR", help="write PNG charts into DIR")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds one request may take in all before it counts as a timeout (default 300)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send ignore_eos=true (vLLM/SGLang) so engines generate exactly "
        "max_tokens; hosted APIs may reject it",
    )


def _add_workload(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (closed loop)")
    g.add_argument(
        "--prompt-tokens",
        type=int,
        default=1000,
        help="synthesise prompts of about this many tokens (default 1000)",
    )
    g.add_argument("--prompt", default=None, help="a fixed prompt text instead of a synthetic one")
    g.add_argument(
        "--max-tokens", type=int, default=256, help="output tokens asked per request (default 256)"
    )
    g.add_argument(
        "--request-class",
        default="interactive",
        choices=("interactive", "batch"),
        help="send X-Request-Class: batch when 'batch' (default interactive)",
    )
    g.add_argument(
        "--same-prompt",
        action="store_true",
        help="send identical prompts (default: each starts with its request number, "
        "so prefix caches do not hit)",
    )
    g.add_argument(
        "--levels",
        type=_levels,
        default=(1, 4, 8, 16, 32, 64),
        help="concurrency levels, increasing (default 1,4,8,16,32,64)",
    )
    g.add_argument(
        "--duration",
        type=_duration,
        default=None,
        help="run each level this long, e.g. 30s, 2m (default 30s unless --requests)",
    )
    g.add_argument(
        "--requests",
        type=int,
        default=None,
        help="run each level for this many requests instead of a duration",
    )
    g.add_argument(
        "--processes",
        type=int,
        default=1,
        help="split each level over N client processes, each its own event loop "
        "(default 1; useful when the client's CPU is the limit and cores are free)",
    )
    g.add_argument("--pause", type=float, default=0.5, help="seconds between levels (default 0.5)")
    g.add_argument(
        "--min-gain",
        type=float,
        default=0.10,
        help="plateau threshold: throughput gain per doubling of concurrency (default 0.10)",
    )
    g.add_argument(
        "--max-drop",
        type=float,
        default=0.10,
        help="degradation threshold: throughput drop below the best earlier level (default 0.10)",
    )
    g.add_argument("--fail-on-errors", action="store_true", help="exit 1 when any request failed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadtest",
        description="Evaluate an OpenAI-compatible endpoint (a backend, the gateway, or both): "
        "probe one request, sweep concurrency (and soak), price it, replay a trace, compare two.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "probe",
        help="one streamed request, checked (step 1)",
        description="One streaming request with a fixed prompt; prints TTFT, total "
        "latency, output tokens, tokens/s and the text, then PASS/FAIL per check. "
        "Exit 0 when every check passes, else 1.",
    )
    _add_target(p)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt (default: a fixed one)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens (default 256)")
    p.add_argument(
        "--min-tps",
        type=float,
        default=50.0,
        help="speed floor, output tokens / total time (default 50 tokens/s)",
    )
    p.add_argument(
        "--no-exact-tokens",
        action="store_true",
        help="do not require exactly --max-tokens output tokens (a model may stop "
        "early at end of sequence)",
    )
    _add_output(p, plot=False)

    p = sub.add_parser(
        "sweep",
        help="closed-loop concurrency levels, plateau (step 2)",
        description="Closed-loop load at each concurrency level; per level "
        "requests/s, output tokens/s, TTFT/TPOT/E2E percentiles and errors by "
        "kind; finds the plateau and the degradation point. With --soak, holds "
        "one level and prints a row per interval, flagging drift.",
    )
    _add_target(p)
    _add_workload(p)
    _add_output(p)
    g = p.add_argument_group("soak")
    g.add_argument(
        "--soak",
        type=_duration,
        metavar="DURATION",
        default=None,
        help="hold --soak-level for DURATION (e.g. 30m) instead of sweeping",
    )
    g.add_argument("--soak-level", type=int, default=32, help="concurrency to hold (default 32)")
    g.add_argument(
        "--soak-interval",
        type=_duration,
        default=60.0,
        help="a row per this interval (default 60s)",
    )
    g.add_argument(
        "--metrics-url",
        default=None,
        help="Prometheus text endpoint of the target, to read "
        "process_resident_memory_bytes each interval",
    )
    g.add_argument(
        "--drift",
        type=float,
        default=0.20,
        help="flag a row when TTFT p99 or memory rise, or throughput falls, by more "
        "than this vs the first interval (default 0.20)",
    )

    p = sub.add_parser(
        "cost",
        help="cost per 1k tokens and a 30-day projection (step 3)",
        description="Cost per 1k tokens at each sweep level and a projection of "
        "a workload over --days; the context (history) re-send is on its own "
        "line. --example runs the seed article's worked example.",
    )
    p.add_argument("--sweep", metavar="FILE", help="a sweep result JSON (from sweep --json)")
    p.add_argument(
        "--example",
        action="store_true",
        help="the worked example: 500 output tokens per request, 10,000 requests per "
        "day, 2,000-token context, illustrative prices; uses the bundled example "
        "sweep unless --sweep is given",
    )
    p.add_argument("--hardware-per-hour", type=float, help="one replica's hardware cost per hour")
    p.add_argument("--fees-per-hour", type=float, help="engine or service fees per hour")
    p.add_argument(
        "--fees-per-1k-tokens", type=float, help="fees per 1k tokens processed (input + output)"
    )
    p.add_argument("--ops-per-month", type=float, help="operations cost per 30-day month")
    p.add_argument("--requests-per-day", type=float, help="requests per day (default 10,000)")
    p.add_argument("--output-tokens", type=int, help="output tokens per request (default 500)")
    p.add_argument(
        "--context-tokens",
        type=int,
        help="input (history + prompt) tokens re-sent per request (default 2,000)",
    )
    p.add_argument("--peak-factor", type=float, help="provision for peak = mean x this (default 1)")
    p.add_argument("--days", type=int, help="projection length in days (default 30)")
    p.add_argument("--input-price-per-1k", type=float, help="hosted API input price per 1k tokens")
    p.add_argument(
        "--output-price-per-1k", type=float, help="hosted API output price per 1k tokens"
    )
    p.add_argument(
        "--baseline-tps",
        type=float,
        help="today's throughput (output tokens/s), to say how much better",
    )
    p.add_argument("--json", metavar="FILE", help="write the estimate as JSON ('-': stdout)")

    p = sub.add_parser(
        "replay",
        help="open-loop replay of an Azure LLM inference trace",
        description="Replays a CSV trace (TIMESTAMP,ContextTokens,GeneratedTokens) "
        "open-loop: prompts synthesised to ContextTokens, max_tokens = "
        "GeneratedTokens; reports per-class TTFT, target attainment and how far "
        "the replay lagged its schedule.",
    )
    _add_target(p)
    p.add_argument("--trace", required=True, help="the CSV trace file")
    p.add_argument("--start", type=int, default=0, help="skip this many rows (default 0)")
    p.add_argument("--limit", type=int, default=None, help="replay at most this many rows")
    p.add_argument(
        "--window",
        type=_duration,
        default=None,
        help="replay only rows within this much trace time of the first (e.g. 5m)",
    )
    p.add_argument(
        "--speedup", type=float, default=1.0, help="compress trace time by this factor (default 1)"
    )
    p.add_argument("--max-output", type=int, default=None, help="cap max_tokens")
    p.add_argument(
        "--batch-share",
        type=float,
        default=0.0,
        help="fraction of requests (or conversations) sent as batch class "
        "(X-Request-Class: batch) (default 0)",
    )
    p.add_argument("--batch-model", default=None, help="model for batch-class requests")
    p.add_argument(
        "--sessions",
        type=int,
        default=0,
        metavar="TURNS",
        help="multi-turn mode: group rows into conversations of TURNS turns; each "
        "turn re-sends the history (earlier prompts and replies)",
    )
    p.add_argument(
        "--ttft-target",
        type=parse_targets,
        default={},
        help="per-class TTFT targets, e.g. interactive=500ms,batch=5s",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the batch-class draw")
    p.add_argument(
        "--max-connections", type=int, default=1024, help="connection pool size (default 1024)"
    )
    _add_output(p)

    p = sub.add_parser(
        "compare",
        help="the same sweep against two endpoints, interleaved",
        description="Runs each level against A then B (alternating order), and "
        "reports B - A for TTFT/E2E/TPOT percentiles and B / A for throughput.",
    )
    _add_target(p, "a", "A")
    _add_target(p, "b", "B")
    _add_workload(p)
    _add_output(p)

    p = sub.add_parser(
        "engine",
        help="run a real local engine: llama-server on a tiny random model",
        description="Starts llama.cpp's llama-server (built by `make llama-server` into "
        "~/.cache/llm-gateway) on a tiny llama model with random weights and the GPT-2 "
        "tokenizer (its text is noise), prints its URL, and serves until Ctrl-C. Point probe, "
        "sweep or a gateway pool at it.",
    )
    p.add_argument("--build", action="store_true",
                   help="build llama-server first when it is not cached (~10-15 min on 2 cores)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8081, help="listen port (default 8081)")
    p.add_argument("--slots", type=int, default=4, help="parallel sequences, -np (default 4)")
    p.add_argument("--ctx", type=int, default=16384,
                   help="KV cache tokens for all slots together, -c (default 16384)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads, -t (default 1: the fastest for the tiny model)")
    p.add_argument("--embedding", type=int, default=256, help="model embedding length (256)")
    p.add_argument("--layers", type=int, default=4, help="model blocks (default 4)")
    p.add_argument("--seed", type=int, default=0, help="model weights seed (default 0)")
    p.add_argument("--alias", default="tiny-llama",
                   help="the model name it answers with (default tiny-llama)")
    p.add_argument("--log", default=None, help="engine log file (default: a temp file)")
    return parser


# --- commands ---------------------------------------------------------------------------


async def _target(url: str, model: str | None, key: str | None, label: str) -> Target:
    key = key or os.environ.get("OPENAI_API_KEY") or None
    if not model:
        model = await _first_model(url, key)
    return Target(url=url, model=model, api_key=key, label=label)


async def _first_model(url: str, key: str | None) -> str:
    """The default ``--model``: the first one ``GET /v1/models`` lists, or a UsageError that
    says what to pass instead."""
    import aiohttp

    where = f"{base_url(url)}/v1/models"
    try:
        models = await list_models(url, key)
    except aiohttp.ClientResponseError as exc:
        hint = ("pass --api-key or set OPENAI_API_KEY" if exc.status in (401, 403)
                else "pass --model")
        raise UsageError(f"GET {where} answered {exc.status} {exc.message}: {hint}") from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise UsageError(f"GET {where} failed ({type(exc).__name__}: {exc}); check --url or "
                         "pass --model") from None
    if not models:
        raise UsageError(f"{where} lists no models; pass --model")
    return models[0]


def _workload(a: argparse.Namespace) -> Workload:
    return Workload(
        prompt_tokens=a.prompt_tokens,
        prompt=a.prompt,
        max_tokens=a.max_tokens,
        ignore_eos=a.ignore_eos,
        klass=a.request_class,
        unique=not a.same_prompt,
    )


def _plan(a: argparse.Namespace) -> SweepPlan:
    duration = a.duration if a.duration is not None or a.requests else 30.0
    return SweepPlan(
        levels=a.levels,
        duration=None if a.requests else duration,
        requests=a.requests,
        processes=max(1, a.processes),
        timeout=a.timeout,
        pause=a.pause,
        min_gain=a.min_gain,
        max_drop=a.max_drop,
    )


def cmd_probe(a: argparse.Namespace) -> int:
    from loadtest.report import print_probe

    async def go() -> Any:
        target = await _target(a.url, a.model, a.api_key, a.label)
        return await run_probe(
            target,
            prompt=a.prompt,
            max_tokens=a.max_tokens,
            min_tps=a.min_tps,
            ignore_eos=a.ignore_eos,
            exact_tokens=not a.no_exact_tokens,
            timeout=a.timeout,
        )

    result = _run(go())
    print_probe(result)
    if a.json:
        write_json(a.json, result.to_dict())
    return 0 if result.passed else 1


def cmd_sweep(a: argparse.Namespace) -> int:
    from loadtest.report import RunProgress, err, level_line, print_sweep

    if a.soak is not None:
        return _soak(a)
    plan = _plan(a)
    progress = RunProgress(enabled=not a.no_progress)

    async def go() -> SweepResult:
        target = await _target(a.url, a.model, a.api_key, a.label)
        return await run_sweep(
            target,
            _workload(a),
            plan,
            on_level_start=lambda c: progress.phase(
                f"concurrency {c}", requests=plan.requests, duration=plan.duration
            ),
            on_result=progress.on_result if plan.processes == 1 else None,
            on_level_end=lambda lv: progress.log(level_line(lv)),
        )

    with progress:
        result = _run(go())
    print_sweep(result)
    if a.json:
        write_json(a.json, result.to_dict())
    if a.plot:
        from loadtest.plots import plot_sweeps

        for path in plot_sweeps([result], a.plot):
            err.print(f"wrote {path}")
    errors = sum(lv.summary.error_count for lv in result.levels)
    return 1 if a.fail_on_errors and errors else 0


def _soak(a: argparse.Namespace) -> int:
    from loadtest.report import RunProgress, err, out, print_soak_row, soak_table
    from loadtest.soak import run_soak

    progress = RunProgress(enabled=not a.no_progress)

    async def go() -> Any:
        target = await _target(a.url, a.model, a.api_key, a.label)
        progress.phase(f"soak at concurrency {a.soak_level}", duration=a.soak)
        return await run_soak(
            target,
            _workload(a),
            concurrency=a.soak_level,
            duration=a.soak,
            interval=a.soak_interval,
            metrics_url=a.metrics_url,
            timeout=a.timeout,
            drift_limit=a.drift,
            on_row=lambda r: print_soak_row(r, progress),
            on_result=progress.on_result,
        )

    with progress:
        result = _run(go())
    out.print(soak_table(result))
    out.print("[red]Drift detected[/]" if result.drifted else "No drift beyond the limits.")
    if a.json:
        write_json(a.json, result.to_dict())
    if a.plot:
        from loadtest.plots import plot_soak

        err.print(f"wrote {plot_soak(result, a.plot)}")
    errors = sum(r.errors for r in result.rows)
    return 1 if a.fail_on_errors and errors else 0


_COST_FIELDS = (
    "hardware_per_hour",
    "fees_per_hour",
    "fees_per_1k_tokens",
    "ops_per_month",
    "requests_per_day",
    "output_tokens",
    "context_tokens",
    "peak_factor",
    "days",
    "input_price_per_1k",
    "output_price_per_1k",
    "baseline_tps",
)


def cost_inputs(a: argparse.Namespace) -> CostInputs:
    """The example's inputs (or the defaults) with every option given on the command line."""
    given = {f: getattr(a, f) for f in _COST_FIELDS if getattr(a, f) is not None}
    if a.example:
        return dataclasses.replace(EXAMPLE, **given)
    if "hardware_per_hour" not in given:
        raise UsageError("--hardware-per-hour is required (or use --example)")
    return CostInputs(**given)


def cmd_cost(a: argparse.Namespace) -> int:
    from loadtest.report import print_cost

    path = a.sweep or (str(EXAMPLE_SWEEP) if a.example else None)
    if path is None:
        raise UsageError("--sweep FILE is required (or use --example)")
    data = json.loads(Path(path).read_text())
    if data.get("kind") == "compare":
        data = data["b"]
    sweep = SweepResult.from_dict(data)
    if sweep.plateau is None and sweep.degradation is None:
        sweep.analyse()
    est = estimate(sweep, cost_inputs(a))
    print_cost(est)
    if a.json:
        write_json(a.json, est.to_dict())
    return 0


def cmd_replay(a: argparse.Namespace) -> int:
    from loadtest.report import RunProgress, err, print_replay
    from loadtest.trace import read_trace

    rows = read_trace(a.trace, start=a.start, limit=a.limit, window_s=a.window)
    if not rows:
        raise UsageError(f"{a.trace}: no rows selected")
    plan = ReplayPlan(
        speedup=a.speedup,
        max_output=a.max_output,
        batch_share=a.batch_share,
        batch_model=a.batch_model,
        sessions=a.sessions,
        ttft_targets=a.ttft_target,
        seed=a.seed,
        timeout=a.timeout,
        max_connections=a.max_connections,
        ignore_eos=a.ignore_eos,
    )
    progress = RunProgress(enabled=not a.no_progress)

    async def go() -> Any:
        target = await _target(a.url, a.model, a.api_key, a.label)
        progress.phase(f"replay {len(rows)} requests", requests=len(rows))
        return await run_replay(target, rows, plan, on_result=progress.on_result)

    with progress:
        result = _run(go())
    print_replay(result)
    if a.json:
        write_json(a.json, result.to_dict())
    if a.plot:
        from loadtest.plots import plot_replay

        err.print(f"wrote {plot_replay(result, a.plot)}")
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from loadtest.compare import run_compare
    from loadtest.report import RunProgress, err, level_line, print_compare

    plan = _plan(a)
    progress = RunProgress(enabled=not a.no_progress)

    async def go() -> Any:
        ta = await _target(a.a_url, a.a_model, a.a_api_key, a.a_label or "A")
        tb = await _target(a.b_url, a.b_model, a.b_api_key, a.b_label or "B")
        return await run_compare(
            ta,
            tb,
            _workload(a),
            plan,
            on_level_start=lambda label, c: progress.phase(
                f"{label} concurrency {c}", requests=plan.requests, duration=plan.duration
            ),
            on_result=progress.on_result if plan.processes == 1 else None,
            on_level_end=lambda lv: progress.log(level_line(lv)),
        )

    with progress:
        result = _run(go())
    print_compare(result)
    if a.json:
        write_json(a.json, result.to_dict())
    if a.plot:
        from loadtest.plots import plot_sweeps

        for path in plot_sweeps([result.a, result.b], a.plot):
            err.print(f"wrote {path}")
    errors = sum(lv.summary.error_count for s in (result.a, result.b) for lv in s.levels)
    return 1 if a.fail_on_errors and errors else 0


def cmd_engine(a: argparse.Namespace) -> int:
    import signal

    from loadtest.engines import build, llama_server, tiny_model

    try:
        binary = build.build_engine() if a.build else build.require_server_binary()
        spec = tiny_model.TinyModelSpec(embedding=a.embedding, layers=a.layers, seed=a.seed)
        model = tiny_model.tiny_model_path(spec)
    except (build.EngineNotBuilt, ValueError) as exc:
        raise UsageError(str(exc)) from None
    server = llama_server.LlamaServer(
        model, slots=a.slots, ctx=a.ctx, threads=a.threads, alias=a.alias, host=a.host,
        port=a.port, log_path=a.log, binary=binary,
    )
    # SIGTERM (a supervisor, `kill`) leaves through the with block too, stopping the engine
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with server:
        print(f"llama-server {server.url}  model {a.alias} ({model.name})", flush=True)
        print(f"log {server.log_path}; Ctrl-C stops it", file=sys.stderr, flush=True)
        assert server.proc is not None
        code = server.proc.wait()
    print(f"llama-server exited ({code}); log {server.log_path}", file=sys.stderr)
    return 1


COMMANDS = {
    "engine": cmd_engine,
    "probe": cmd_probe,
    "sweep": cmd_sweep,
    "cost": cmd_cost,
    "replay": cmd_replay,
    "compare": cmd_compare,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: ``loadtest = "loadtest.cli:main"``."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"loadtest {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
