"""The engines a benchmark runs against: simulators (``gateway sim``) or llama-servers.

The routing benches (``prefix_bench``, ``fairness_bench``, ``routing_bench``) take
``--engine sim|llamacpp`` (:func:`add_engine_arguments`) and start their backends here, one
:class:`EngineSpec` each, so that the rest of a bench (its workload, its gateway policies, its
table) is the same on both:

- ``sim``: ``python -m gateway sim --profile P --port N --queue-limit 100000 [flags]`` (the
  bench's own profile and flags, as before; ``--sim-profile`` replaces the profile, e.g.
  ``tiny-llamacpp``, the simulator calibrated against the engine below);
- ``llamacpp``: ``llama-server`` (:class:`~loadtest.engines.llama_server.LlamaServer`) on the
  tiny random llama of :mod:`loadtest.engines.tiny_model` (``--model-embedding`` 256,
  ``--model-layers`` 4 by default), ``-t --engine-threads`` (1), ``-np`` the spec's slots,
  ``-c`` slots x ctx per slot, ``--alias sim-model`` (the model name the benches' policies
  already send), ``--ignore-eos`` (every answer is ``max_tokens`` long, as the simulator's
  are: the random model would otherwise stop at a sampled end-of-text now and then) and
  ``--threads-http`` slots + 16 (its HTTP server holds a thread per open connection, idle
  keep-alive ones included: the default, slots + 2, would let the gateway's pooled
  connections starve new ones) and ``--cache-ram 1024`` (its prompt cache in host memory, 8 GiB
  by default, capped for a shared box). Pools in front of them get ``engine: llamacpp``
  (:func:`pool_engine_keys`), and a bench that measures prefix caching also
  ``cache_isolation: shared`` (else the gateway sends ``cache_prompt: false``).

Per backend, :func:`load` reads running + waiting (the simulator's ``/sim/stats``, llama.cpp's
``llamacpp:requests_processing`` + ``llamacpp:requests_deferred``) and :func:`prompt_counters`
the prompt tokens, the cached ones and the prefilled ones (``vllm:prompt_tokens_total`` and
``vllm:prefix_cache_hits_total``; ``llamacpp:prompt_tokens_total``, which excludes cached
tokens, and ``llamacpp:prompt_tokens_cached_total``).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ENGINES", "MODEL_ALIAS", "EngineSpec", "Fleet", "add_engine_arguments",
           "counters_from_text", "ctx_per_slot", "llama_server", "load", "parse_flat",
           "pool_engine_keys", "prompt_counters", "sim_command", "start_fleet", "wait_http"]

ENGINES = ("sim", "llamacpp")
CACHE_RAM_MIB = 1024
"""llama-server's ``--cache-ram`` (its host-memory prompt cache; 8 GiB by default): two
servers on a shared box stay well inside its memory."""
MODEL_ALIAS = "sim-model"
"""The ``--alias`` of every llama-server here: the ``backend_model`` the benches' policies use."""


@dataclass(frozen=True)
class EngineSpec:
    """One backend. ``profile`` and ``sim_args`` are the simulator's (``--profile``, extra
    flags); ``slots`` and ``ctx_per_slot`` llama.cpp's (``-np``, ``-c`` / slots). ``sim_slots``
    overrides the simulator profile's running batch (``--slots``) when set."""

    profile: str = "interactive"
    sim_args: tuple[str, ...] = ()
    slots: int = 16
    ctx_per_slot: int = 2048
    sim_slots: int | None = None


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--sim-profile`` and llama.cpp's settings."""
    g = p.add_argument_group("engine")
    g.add_argument("--engine", choices=ENGINES, default="sim",
                   help="the backends: simulators (sim, the default) or llama.cpp's llama-server "
                   "on a tiny random model (llamacpp; `make llama-server` builds it)")
    g.add_argument("--sim-profile", default=None,
                   help="the simulators' profile instead of the bench's own (e.g. "
                   "tiny-llamacpp, calibrated against the llamacpp engine)")
    g.add_argument("--engine-threads", type=int, default=1,
                   help="llama-server -t (1: the tiny model decodes fastest on one thread)")
    g.add_argument("--model-embedding", type=int, default=256,
                   help="the tiny model's embedding length (256)")
    g.add_argument("--model-layers", type=int, default=4, help="the tiny model's layers (4)")


def ctx_per_slot(tokens: int, margin: int = 64, multiple: int = 256) -> int:
    """A slot's context for requests of up to ``tokens`` prompt + output tokens: with a margin
    for the chat template, rounded up to ``multiple``."""
    need = tokens + margin
    return -(-need // multiple) * multiple


def pool_engine_keys(args: argparse.Namespace, *, shared_cache: bool = False) -> dict[str, Any]:
    """The keys a pool of the chosen engine gets: ``{}`` for the simulators (vLLM-like: the
    gateway learns it from their metric names), ``engine: llamacpp`` (plus ``cache_isolation:
    shared`` when the bench measures prefix caching within its one tenant) for llama.cpp."""
    if getattr(args, "engine", "sim") != "llamacpp":
        return {}
    out: dict[str, Any] = {"engine": "llamacpp"}
    if shared_cache:
        out["cache_isolation"] = "shared"
    return out


@dataclass
class Fleet:
    """The started backends: their URLs, in spec order, and how to stop them."""

    engine: str
    urls: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    servers: list[Any] = field(default_factory=list)  # LlamaServer
    specs: list[EngineSpec] = field(default_factory=list)
    sim_profile: str | None = None  # replaces every spec's profile

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def describe(self) -> list[str]:
        """One line per backend: what it is."""
        out = []
        for url, spec in zip(self.urls, self.specs, strict=True):
            if self.engine == "llamacpp":
                out.append(f"{url}: llama-server -np {spec.slots} -c "
                           f"{spec.slots * spec.ctx_per_slot}")
            else:
                slots = () if spec.sim_slots is None else ("--slots", str(spec.sim_slots))
                out.append(f"{url}: gateway sim --profile {self.sim_profile or spec.profile} "
                           + " ".join((*spec.sim_args, *slots)))
        return out


def sim_command(spec: EngineSpec, port: int, profile: str | None = None) -> list[str]:
    """The simulator's command line for ``spec`` (``profile`` replaces the spec's)."""
    cmd = [sys.executable, "-m", "gateway", "sim", "--profile", profile or spec.profile,
           "--port", str(port), "--queue-limit", "100000", *spec.sim_args]
    if spec.sim_slots is not None:
        cmd += ["--slots", str(spec.sim_slots)]
    return cmd


def llama_server(spec: EngineSpec, args: argparse.Namespace, log_path: Path,
                 model: Path | None = None, binary: Path | None = None) -> Any:
    """A (not started) :class:`LlamaServer` for ``spec`` on the tiny model of ``args`` (written
    into the engine cache once; ``model`` and ``binary`` replace the model file and the cached
    llama-server)."""
    from loadtest.engines.llama_server import LlamaServer
    from loadtest.engines.tiny_model import TinyModelSpec, tiny_model_path

    if model is None:
        model = tiny_model_path(TinyModelSpec(embedding=args.model_embedding,
                                              layers=args.model_layers,
                                              context=max(4096, spec.ctx_per_slot)))
    return LlamaServer(model, slots=spec.slots, ctx=spec.slots * spec.ctx_per_slot,
                       threads=args.engine_threads, alias=MODEL_ALIAS, log_path=log_path,
                       binary=binary,
                       extra_args=["--ignore-eos", "--threads-http", str(spec.slots + 16),
                                   "--cache-ram", str(CACHE_RAM_MIB)])


def start_fleet(specs: Sequence[EngineSpec], args: argparse.Namespace, env: dict[str, str],
                log_dir: Path, wait: Any) -> Fleet:
    """Start one backend per spec (all at once) and wait until each answers ``/health``.

    ``wait(url, proc)`` is the bench's own readiness poll for simulators."""
    from loadtest.engines.llama_server import free_port

    engine = getattr(args, "engine", "sim")
    fleet = Fleet(engine, specs=list(specs), sim_profile=getattr(args, "sim_profile", None))
    try:
        if engine == "llamacpp":
            for i, spec in enumerate(specs):
                server = llama_server(spec, args, log_dir / f"llama-server-{i}.log")
                fleet.servers.append(server)
                server.start()
                fleet.urls.append(server.url)
        else:
            for spec in specs:
                port = free_port()
                fleet.procs.append(subprocess.Popen(
                    sim_command(spec, port, getattr(args, "sim_profile", None)), env=env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                fleet.urls.append(f"http://127.0.0.1:{port}")
            for url, proc in zip(fleet.urls, fleet.procs, strict=True):
                wait(url + "/health", proc)
    except BaseException:
        fleet.stop()
        raise
    return fleet


def _metrics_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text: str = r.read().decode()
    return text


def parse_flat(text: str, names: Sequence[str]) -> dict[str, float]:
    """The sum over label sets of each named series in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


LLAMA_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                  "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_total")


def prompt_counters(url: str, engine: str) -> dict[str, float]:
    """:func:`counters_from_text` of the backend's ``/metrics``."""
    return counters_from_text(_metrics_text(url), engine)


def counters_from_text(text: str, engine: str) -> dict[str, float]:
    """Counters in the simulator's (vLLM's) names: ``vllm:prompt_tokens_total`` (every prompt
    token, cached or not), ``vllm:prefix_cache_hits_total`` and ``..._queries_total``. For
    llama.cpp they are derived (prompt = processed + cached, hits = cached, queries = prompt),
    and its ``llamacpp:*`` counters are kept beside them."""
    if engine != "llamacpp":
        return parse_flat(text, ("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total",
                                 "vllm:prefix_cache_queries_total"))
    raw = parse_flat(text, LLAMA_COUNTERS)
    done = raw.get("llamacpp:prompt_tokens_total", 0.0)
    cached = raw.get("llamacpp:prompt_tokens_cached_total", 0.0)
    return {**raw, "vllm:prompt_tokens_total": done + cached,
            "vllm:prefix_cache_hits_total": cached,
            "vllm:prefix_cache_queries_total": done + cached}


LLAMA_LOAD = ("llamacpp:requests_processing", "llamacpp:requests_deferred")


async def load(session: Any, url: str, engine: str) -> float:
    """Running + waiting requests on one backend now."""
    if engine == "llamacpp":
        async with session.get(url + "/metrics") as r:
            text = await r.text()
        return float(sum(parse_flat(text, LLAMA_LOAD).values()))
    async with session.get(url + "/sim/stats") as r:
        s = await r.json()
    return float(s["running"] + s["waiting"])


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 60) -> None:
    """Poll ``url`` until 200 (raising if ``proc`` exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")
