"""What differs between inference engines, in one place.

A backend's ``engine`` (its own key, else its pool's; :data:`gateway.config.model.Engine`)
decides four things the gateway does differently per engine. Unset, it is read from the
metric names of the backend's ``/metrics`` once the pool scrapes ``signals`` (the first known
name tells), and until then it is ``unknown``: every engine's names are read, the error shapes
of all are recognised, and the policy's ``isolation.cache`` applies.

=========  ==============================  ==============================  ===========  ===========
engine     waiting / running requests      KV-cache use (0-1)              cache        cached
                                                                           isolation    tokens
=========  ==============================  ==============================  ===========  ===========
vllm       ``vllm:num_requests_waiting`` / ``vllm:kv_cache_usage_perc``    cache_salt   usage [1]
           ``vllm:num_requests_running``   (``vllm:gpu_cache_usage_perc``
                                           before 0.10)
sglang     ``sglang:num_queue_reqs`` /     ``sglang:token_usage``          cache_salt   usage [1]
           ``sglang:num_running_reqs``
llamacpp   ``llamacpp:requests_deferred``  ``llamacpp:kv_cache_usage_      cache_prompt usage [1],
           / ``llamacpp:requests_          ratio`` (builds that still      : false      else
           processing`` (``--metrics``)    export it)                                   timings [2]
tgi        ``tgi_queue_size`` /            none                            none         none
           ``tgi_batch_current_size``
ollama,    none (no Prometheus metrics)    none                            none         usage [1]
openai,
anthropic
=========  ==============================  ==============================  ===========  ===========

[1] ``usage.prompt_tokens_details.cached_tokens``; [2] ``timings.cache_n``, which llama.cpp
builds before the usage detail report on the answer (and a stream's last chunk): both are read
by ``gateway.accounting.usage`` as aliases of one count (a field only llama.cpp writes).

**Signals** (:func:`read_signals`): waiting and running are summed over label sets, the KV use
is the largest. A backend whose scrape answers with none of its engine's names (an engine
started without ``--metrics``, a path that is not the engine's) is logged once and shown as
``gateway_engine_signals_missing{pool,backend} 1`` (:mod:`gateway.upstream.monitors`).

**Cache isolation** (:func:`cache_mode`): a pool that sets no ``cache_isolation`` isolates
tenants the way its engines can: ``salt`` (vLLM, SGLang), ``no_cache`` (llama.cpp, which takes
no salt: ``cache_prompt: false``), or nothing for an engine that takes neither (TGI, Ollama: no
per-request switch; OpenAI and Anthropic: hosted APIs that refuse unknown members), unless the
policy's ``isolation.cache`` is ``shared``. A pool with a backend of unknown engine, or whose
engines isolate in different ways, keeps the policy's ``isolation.cache``.

**Errors** (:func:`openai_error`): an engine's error answer (4xx, relayed) is given OpenAI's
shape, its message kept: llama.cpp's ``exceed_context_size_error`` (and vLLM's or SGLang's
"maximum context length", TGI's validation of the input's length) becomes
``invalid_request_error`` with code ``context_length_exceeded``, as OpenAI answers it; vLLM's
older flat ``{"object": "error", ...}`` and TGI's ``{"error": "...", "error_type": ...}`` are
nested under ``error``. Anything else is relayed as the engine wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

if TYPE_CHECKING:
    from gateway.config.model import CacheIsolation
    from gateway.routing.backend import BackendState
    from gateway.routing.pool import PoolState

__all__ = [
    "ENGINES",
    "UNKNOWN",
    "EngineSignals",
    "Traits",
    "cache_mode",
    "engine_of",
    "openai_error",
    "pool_engine",
    "read_signals",
    "unisolated",
]

UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Traits:
    """One engine's metric names and prompt-cache switch."""

    #: metric names of requests waiting in the engine's queue (summed)
    waiting: tuple[bytes, ...] = ()
    #: ... of requests it is running (summed)
    running: tuple[bytes, ...] = ()
    #: ... of its KV-cache use, 0-1 (the largest)
    kv: tuple[bytes, ...] = ()
    #: how it keeps tenants apart in its prompt cache (None: it takes no per-request switch)
    cache: Literal["salt", "no_cache"] | None = None


ENGINES: dict[str, Traits] = {
    "vllm": Traits((b"vllm:num_requests_waiting",), (b"vllm:num_requests_running",),
                   (b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc"), "salt"),
    "sglang": Traits((b"sglang:num_queue_reqs",), (b"sglang:num_running_reqs",),
                     (b"sglang:token_usage",), "salt"),
    "llamacpp": Traits((b"llamacpp:requests_deferred",), (b"llamacpp:requests_processing",),
                       (b"llamacpp:kv_cache_usage_ratio",), "no_cache"),
    "tgi": Traits((b"tgi_queue_size",), (b"tgi_batch_current_size",)),
    "ollama": Traits(),
    "openai": Traits(),
    "anthropic": Traits(),
}

_WAITING, _RUNNING, _KV = 0, 1, 2
#: metric name -> (its engine, what it measures)
_NAMES: dict[bytes, tuple[str, int]] = {
    name: (engine, kind)
    for engine, traits in ENGINES.items()
    for kind, names in enumerate((traits.waiting, traits.running, traits.kv))
    for name in names
}


# --- which engine ---------------------------------------------------------------------------
def engine_of(pool: PoolState, backend: BackendState) -> str:
    """A backend's engine: its own key, its pool's, the one its metrics showed, or unknown."""
    return (backend.config.engine or pool.config.engine or backend.detected_engine
            or UNKNOWN)


def pool_engine(pool: PoolState) -> str:
    """The engine of every backend of ``pool``; unknown when one is unknown or they differ."""
    found: str | None = None
    default = pool.config.engine
    for backend in pool.backends:
        engine = backend.config.engine or default or backend.detected_engine
        if engine is None or (found is not None and engine != found):
            return UNKNOWN
        found = engine
    return found or UNKNOWN


# --- cache isolation ------------------------------------------------------------------------
def cache_mode(pool: PoolState, default: CacheIsolation) -> CacheIsolation:
    """How ``pool`` keeps tenants apart when it sets no ``cache_isolation`` (``default``: the
    policy's ``isolation.cache``): its engines' way when they are known and share one."""
    if default == "shared":
        return default
    found: CacheIsolation | None = None
    pool_default = pool.config.engine
    for backend in pool.backends:
        traits = ENGINES.get(backend.config.engine or pool_default or backend.detected_engine
                             or UNKNOWN)
        if traits is None:
            return default
        mode = traits.cache or "shared"
        if found is not None and mode != found:
            return default
        found = mode
    return found or default


def unisolated(pool: PoolState, default: CacheIsolation) -> str | None:
    """The engine of a pool whose tenants the policy wants apart but whose engine takes no
    cache switch (the tenants share its prompt cache), else None."""
    engine = pool_engine(pool)
    if pool.config.cache_isolation is None and default != "shared" and \
            engine in ENGINES and ENGINES[engine].cache is None:
        return engine
    return None


# --- signals --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EngineSignals:
    """What one scrape said: requests waiting and running, KV-cache use (None: not given),
    and the engine whose names it used."""

    engine: str
    waiting: float | None = None
    running: float | None = None
    kv: float | None = None


def read_signals(text: bytes, engine: str = UNKNOWN) -> EngineSignals | None:
    """The signals in Prometheus text ``text`` under ``engine``'s names (any engine's while it
    is unknown: the first name found tells which); None when it holds none of them."""
    found: list[float | None] = [None, None, None]  # waiting, running, KV
    seen: str | None = None
    for line in text.splitlines():
        if not line or line[0] == 35:  # '#': HELP, TYPE
            continue
        brace = line.find(b"{")
        name = line[:brace] if brace >= 0 else line.split(b" ", 1)[0]
        hit = _NAMES.get(name.strip())
        if hit is None:
            continue
        owner, kind = hit
        if engine != UNKNOWN and owner != engine:
            continue
        if seen is None:
            seen = owner
        elif owner != seen:
            continue  # one engine's names per backend
        rest = line[line.rfind(b"}") + 1:] if brace >= 0 else line[len(name):]
        try:
            value = float(rest.split()[0])  # a timestamp may follow the value
        except (IndexError, ValueError):
            continue
        current = found[kind]
        if kind == _KV:
            found[kind] = value if current is None else max(current, value)
        else:
            found[kind] = value if current is None else current + value
    if seen is None:
        return None
    return EngineSignals(seen, found[_WAITING], found[_RUNNING], found[_KV])


# --- errors ---------------------------------------------------------------------------------
_CONTEXT = "context_length_exceeded"
#: TGI's validation of the input's length (``inputs`` tokens + ``max_new_tokens`` must be <=
#: N; ``inputs`` must have less than N tokens)
_TGI_LENGTH = re.compile(r"must be <= \d+|must have less than \d+ tokens")
_decode = msgspec.json.decode
_encode = msgspec.json.encode


def _openai(message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": code}}


def _llamacpp(data: dict[str, Any]) -> dict[str, Any] | None:
    inner = data.get("error")
    if isinstance(inner, dict) and inner.get("type") == "exceed_context_size_error":
        message = inner.get("message")
        return _openai(message if isinstance(message, str) else "", _CONTEXT)
    return None


def _vllm(data: dict[str, Any]) -> dict[str, Any] | None:
    inner = data.get("error")
    flat = not isinstance(inner, dict) and data.get("object") == "error"
    body = data if flat else inner
    if not isinstance(body, dict):
        return None
    message = body.get("message")
    if not isinstance(message, str) or (not flat and isinstance(body.get("code"), str)):
        return None  # OpenAI's own shape, a code of its own already
    if "maximum context length" in message:
        return _openai(message, _CONTEXT)
    if flat:  # vLLM before 0.10, SGLang: the error's members at the top
        return {"error": {"message": message, "type": body.get("type"),
                          "param": body.get("param"), "code": body.get("code")}}
    return None


def _tgi(data: dict[str, Any]) -> dict[str, Any] | None:
    message, kind = data.get("error"), data.get("error_type")
    if not isinstance(message, str) or not isinstance(kind, str):
        return None
    if kind == "validation" and _TGI_LENGTH.search(message):
        return _openai(message, _CONTEXT)
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


_ERRORS = {"llamacpp": (_llamacpp,), "vllm": (_vllm,), "sglang": (_vllm,), "tgi": (_tgi,)}
_ALL = (_llamacpp, _vllm, _tgi)


def openai_error(engine: str, body: bytes) -> bytes:
    """An engine's error answer in OpenAI's shape when ``engine`` writes it otherwise (see the
    module docstring); else ``body`` itself."""
    mappers = _ERRORS.get(engine, _ALL if engine not in ENGINES else ())
    if not mappers or not body.lstrip().startswith(b"{"):
        return body
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        return body
    if not isinstance(data, dict):
        return body
    for mapper in mappers:
        mapped = mapper(data)
        if mapped is not None:
            return _encode(mapped)
    return body
