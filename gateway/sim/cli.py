"""Command line of the simulator: ``gateway sim --port P --profile interactive|batch [...]``.

:func:`add_arguments` fills a parser (the gateway's CLI mounts it as a subcommand) and
:func:`main` serves until interrupted. Every flag left unset keeps the profile's value.
"""

from __future__ import annotations

import argparse
import contextlib

from gateway.sim.profiles import PROFILES
from gateway.sim.server import run

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags to ``parser``."""
    parser.description = parser.description or (
        "Serve a simulated continuous-batching inference engine (vLLM-like) behind an "
        "OpenAI-compatible API (chat, completions, embeddings, Responses) and Anthropic's "
        "Messages API, with vLLM metrics and fault injection."
    )
    srv = parser.add_argument_group("server")
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    srv.add_argument("--port", type=int, default=8000, help="port to bind (default %(default)s)")
    srv.add_argument(
        "--model",
        dest="models",
        action="append",
        metavar="NAME",
        help="served model name; repeat for aliases (default sim-model). The first labels metrics.",
    )
    srv.add_argument(
        "--strict-models",
        action="store_true",
        help="answer 404 for a model not given by --model (default: accept any name)",
    )
    srv.add_argument(
        "--default-max-tokens",
        type=int,
        metavar="N",
        help="output tokens when a request sets no max_tokens (default 64)",
    )
    srv.add_argument(
        "--natural-length",
        action="store_true",
        help="a text answer ends by itself after --default-max-tokens when the request's "
        "max_tokens allows more (default: it is exactly max_tokens long)",
    )
    srv.add_argument(
        "--encoding",
        choices=["o200k_base", "cl100k_base"],
        help="tiktoken encoding for prompt token counts (default o200k_base)",
    )
    srv.add_argument("--seed", type=int, help="seed of step jitter and error-rate draws")
    srv.add_argument(
        "--prompt-cache-entries",
        type=int,
        metavar="N",
        help="prompt prefixes the Messages API's cache_control cache keeps (default 256)",
    )

    eng = parser.add_argument_group("engine (override the profile)")
    eng.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="interactive",
        help="interactive: 32 slots, 2048 tokens/step, queue 256; batch: 256 slots, "
        "8192 tokens/step, queue 4096 (default %(default)s)",
    )
    eng.add_argument(
        "--speedup", type=float, help="divide every modelled time by this factor (default 1)"
    )
    eng.add_argument(
        "--jitter", type=float, help="relative std-dev of Gaussian noise per step (default 0.05)"
    )
    eng.add_argument(
        "--slots", dest="max_running", type=int, metavar="S", help="max running sequences"
    )
    eng.add_argument(
        "--step-tokens", type=int, metavar="T", help="token budget per step (decodes + prefill)"
    )
    eng.add_argument("--kv-tokens", type=int, metavar="K", help="KV-cache capacity in tokens")
    eng.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_const",
        const=False,
        help="turn off automatic prefix caching (on by default, as in vLLM)",
    )
    eng.add_argument(
        "--queue-limit",
        type=int,
        metavar="N",
        help="longest waiting queue; beyond it requests get 503 queue_full",
    )

    flt = parser.add_argument_group(
        "fault injection (defaults for every request; x-sim-* request headers override)"
    )
    flt.add_argument(
        "--error-status", type=int, metavar="CODE", help="answer this HTTP status (e.g. 500)"
    )
    flt.add_argument(
        "--error-rate",
        type=float,
        metavar="P",
        help="probability 0..1 of answering --error-status (default 1 when a status is set)",
    )
    flt.add_argument(
        "--extra-latency-ms", type=float, metavar="MS", help="delay before the response starts"
    )
    flt.add_argument(
        "--stall-ms",
        type=float,
        metavar="MS",
        help="stall before the first token (after the headers when streaming)",
    )
    flt.add_argument(
        "--disconnect-after",
        type=int,
        metavar="N",
        help="close the connection after N streamed content chunks, mid-stream",
    )
    flt.add_argument(
        "--error-event-after",
        type=int,
        metavar="N",
        help="end a stream after N tokens with an in-stream error event (an engine failing)",
    )
    flt.add_argument(
        "--retry-after",
        type=int,
        metavar="S",
        help="answer 429 with a Retry-After: S header",
    )


_SETTINGS = (
    "models",
    "strict_models",
    "default_max_tokens",
    "natural_length",
    "encoding",
    "seed",
    "prompt_cache_entries",
    "speedup",
    "jitter",
    "max_running",
    "step_tokens",
    "kv_tokens",
    "queue_limit",
    "prefix_caching",
    "error_status",
    "error_rate",
    "extra_latency_ms",
    "stall_ms",
    "disconnect_after",
    "error_event_after",
    "retry_after",
)


def main(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the process exit code."""
    overrides = {name: getattr(args, name, None) for name in _SETTINGS}
    if not overrides["strict_models"]:
        overrides["strict_models"] = None
    with contextlib.suppress(KeyboardInterrupt):
        run(args.host, args.port, args.profile, **overrides)
    return 0
