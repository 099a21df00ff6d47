"""Routing on real llama-servers behind a real gateway: the engines' scraped signals steering
backend choice, prefix routing measured by the engine's own prompt cache, and a killed engine
(a broken stream billed for what was sent, the backend ejected, then back when it returns)."""

from __future__ import annotations

import random
import re
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from loadtest.engines.llama_server import LlamaServer
from tests.engines.conftest import (
    CHAT_MODEL,
    PREFIX_MODEL,
    SIGNALS_MODEL,
    admin_stats,
    engine_backend,
    engine_metrics,
    engine_policy,
    gateway_metrics,
    openai_client,
    record_of,
    start_gateway,
    wait_for,
)
from tests.helpers import GatewayProcess

pytestmark = [pytest.mark.engine, pytest.mark.process]

Engines = tuple[LlamaServer, LlamaServer]

WORDS = (
    "river", "stone", "lantern", "harbor", "meadow", "violet", "copper", "thunder", "orchard",
    "saddle", "whisper", "granite", "falcon", "ember", "willow", "compass", "lattice",
    "marble", "quiver", "tundra", "beacon", "cobalt", "fable", "glacier", "hollow", "ivory",
    "juniper", "kettle", "lagoon", "mosaic", "nectar", "oasis", "pebble",
)


def long_system_prompt(words: int = 400) -> str:
    """A system prompt no engine has seen (~1.3 GPT-2 tokens a word)."""
    rng = random.Random(uuid.uuid4().int)
    return "Reference notes " + uuid.uuid4().hex + ": " + " ".join(
        rng.choice(WORDS) for _ in range(words))


def _series(text: str, name: str, **labels: str) -> float | None:
    """The value of metric ``name`` with these labels (among others) in Prometheus text."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rfind("}") + 1]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


class Flood:
    """``n`` long streams sent straight to an engine (not through the gateway), each read
    until :meth:`stop` closes it (so the engine drops it)."""

    def __init__(self, server: LlamaServer, n: int) -> None:
        self.server = server
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._one, daemon=True) for _ in range(n)]

    def _one(self) -> None:
        body = {"messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 1900, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{self.server.url}/v1/chat/completions", json=body,
                              timeout=120) as r:
                for _ in r.iter_lines():
                    if self.stopping.is_set():
                        return
        except httpx.HTTPError:
            return

    def __enter__(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=30)


# --- 6. engine signals ----------------------------------------------------------------------

def test_engine_signals_are_read(gateway: GatewayProcess) -> None:
    """``signals:`` with ``engine: llamacpp``: the scrapes hold the engine's names (the
    ``gateway_engine_signals_missing`` gauge is 0 for both backends); a pool that declares the
    wrong engine (vllm) reads none of them and says so (1)."""
    def gauges() -> tuple[float | None, float | None, float | None]:
        text = gateway_metrics(gateway)
        return (_series(text, "gateway_engine_signals_missing", pool="signals", backend="a"),
                _series(text, "gateway_engine_signals_missing", pool="signals", backend="b"),
                _series(text, "gateway_engine_signals_missing", pool="signals-vllm",
                        backend="a"))

    wait_for("the signals gauges", lambda: None not in gauges(), timeout=15, interval=0.25)
    wait_for("llama.cpp's names read, vLLM's missing", lambda: gauges() == (0.0, 0.0, 1.0),
             timeout=15, interval=0.25)


def test_engine_queue_steers_backend_choice(gateway: GatewayProcess,
                                            llama_servers: Engines) -> None:
    """Engine ``a`` gets 6 long requests straight from clients the gateway never sees: 2 run
    (its 2 slots) and 4 wait (``llamacpp:requests_deferred``). The gateway's own counts of
    both backends are 0, so only the scraped waiting queue tells them apart: every request of
    the ``signals`` pool goes to ``b`` (by chance: 1 in 64 for 6 requests)."""
    a, _ = llama_servers
    with Flood(a, 6):
        wait_for("engine a's queue", lambda: engine_metrics(a)["llamacpp:requests_deferred"] >= 2,
                 timeout=20)
        running = engine_metrics(a)["llamacpp:requests_processing"]
        assert running == 2
        # the pool scrapes every 0.25 s: wait for a few scrapes (no event tells of one)
        threading.Event().wait(1.5)
        client = openai_client(gateway)
        backends = []
        for _ in range(6):
            raw = client.chat.completions.with_raw_response.create(
                model=SIGNALS_MODEL, max_tokens=2,
                messages=[{"role": "user", "content": "Hi"}])
            assert raw.parse().model == SIGNALS_MODEL
            backends.append(record_of(gateway, raw.headers["x-request-id"])["backend"])
        still_waiting = engine_metrics(a)["llamacpp:requests_deferred"]
    assert backends == ["b"] * 6, f"engine a still had {still_waiting:.0f} waiting at the end"
    assert still_waiting >= 1, "the flood ended before the requests were sent: no evidence"
    wait_for("engine a idle again",
             lambda: engine_metrics(a)["llamacpp:requests_processing"] == 0, timeout=30)


# --- 7. prefix routing, measured by the engine's own prompt cache -----------------------------

def test_prefix_routing_hits_the_engines_cache(gateway: GatewayProcess) -> None:
    """``strategy: prefix`` and ``cache_isolation: shared``: one tenant's requests that share a
    long system prompt all land on the backend that holds it, and from the second one on the
    engine reports most of the prompt as cached (``prompt_tokens_details.cached_tokens``)."""
    client = openai_client(gateway)
    system = long_system_prompt()
    served: list[tuple[str, int, int]] = []  # (backend, prompt tokens, cached tokens)
    for i, question in enumerate(("What is first?", "And the second one?",
                                  "Which is the longest?", "Sum them up.")):
        raw = client.chat.completions.with_raw_response.create(
            model=PREFIX_MODEL, max_tokens=2,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": f"{i}: {question}"}])
        answer = raw.parse()
        assert answer.model == PREFIX_MODEL and answer.usage is not None
        details = answer.usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None and details.cached_tokens else 0
        record = record_of(gateway, raw.headers["x-request-id"])
        assert record["cached"] == cached  # the engine's count, on the record
        assert record["prompt_total"] == answer.usage.prompt_tokens
        served.append((record["backend"], answer.usage.prompt_tokens, cached))
    first_backend, first_prompt, first_cached = served[0]
    assert first_prompt > 400
    assert first_cached < first_prompt // 2  # never seen: (almost) nothing cached
    for backend, prompt, cached in served[1:]:
        assert backend == first_backend, served
        assert cached >= 0.8 * first_prompt, served  # the shared system prompt, from cache
        assert cached < prompt


def test_llamacpp_default_isolation_turns_its_cache_off(gateway: GatewayProcess) -> None:
    """The ``chat`` pool sets no ``cache_isolation``: for llama.cpp the gateway sends
    ``cache_prompt: false``, so the same long prompt twice is never a cache hit."""
    client = openai_client(gateway)
    messages: Any = [{"role": "system", "content": long_system_prompt()},
                {"role": "user", "content": "Once more."}]
    for _ in range(3):
        answer = client.chat.completions.create(model=CHAT_MODEL, max_tokens=2,
                                                messages=messages)
        assert answer.usage is not None and answer.usage.prompt_tokens > 400
        details = answer.usage.prompt_tokens_details
        assert details is None or not details.cached_tokens


# --- 8. a killed engine ------------------------------------------------------------------------

@pytest.fixture
def third_engine(engine_model: Path, llama_server_bin: Path,
                 tmp_path: Path) -> Iterator[LlamaServer]:
    """A third llama-server of this test's own (1 slot), stopped at the end whatever state
    the test left it in."""
    server = LlamaServer(engine_model, slots=1, ctx=2048, threads=1, alias="tiny-llama",
                         log_path=tmp_path / "engine-third.log", binary=llama_server_bin)
    with server:
        yield server


def test_killed_engine_mid_stream(third_engine: LlamaServer, llama_servers: Engines,
                                  engine_model: Path, llama_server_bin: Path,
                                  tmp_path: Path) -> None:
    """Pool ``kill``: the third engine (weight 1) and engine ``a`` as a spare (weight 0.01, so
    every request goes to the third while it is healthy). The third is SIGKILLed after a
    stream's first chunks: the stream ends with an error event, the record bills the output
    sent (outcome failed); the dead backend is ejected and the spare serves meanwhile; started
    again on the same port, it is back and serves again."""
    spare = llama_servers[0]
    port = third_engine.port
    pools = [{"name": "kill", "engine": "llamacpp",
              "health": {"path": "/health", "interval": 0.5, "timeout": 1.0,
                         "eject_after": 1, "eject_base": 1.0, "eject_max": 2.0},
              "backends": [engine_backend("third", third_engine),
                           engine_backend("spare", spare, weight=0.01)]}]
    models = [{"name": "tiny-kill", "pool": "kill", "backend_model": "tiny-llama"}]
    gw = start_gateway(tmp_path, engine_policy(pools, models))
    restarted: LlamaServer | None = None
    try:
        client = openai_client(gw)

        def backend_of_one() -> str:
            raw = client.chat.completions.with_raw_response.create(
                model="tiny-kill", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
            assert raw.parse().model == "tiny-kill"
            backend: str = record_of(gw, raw.headers["x-request-id"])["backend"]
            return backend

        assert backend_of_one() == "third"

        stream = client.chat.completions.create(
            model="tiny-kill", max_tokens=1900, stream=True,
            messages=[{"role": "user", "content": "Tell me a long story."}],
            extra_body={"ignore_eos": True})
        request_id = stream.response.headers["x-request-id"]
        chunks = 0
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    chunks += 1
                    if chunks == 5:
                        assert third_engine.proc is not None
                        third_engine.proc.send_signal(signal.SIGKILL)
        assert chunks >= 5
        # the stream's error event (not a dropped socket), in OpenAI's shape
        assert isinstance(err.value.body, dict), err.value.body
        assert err.value.body["code"] == "backend_error" and err.value.body["type"] == "api_error"
        assert "third" in err.value.message
        third_engine.stop()  # reap it
        record = record_of(gw, request_id)
        assert record["outcome"] == "failed", record
        assert record["backend"] == "third"
        assert record["output"] > 0  # billed for what was sent

        wait_for("the dead backend ejected",
                 lambda: admin_stats(gw)["pools"]["kill"]["backends"]["third"]["ejected"],
                 timeout=15, interval=0.1)
        for _ in range(4):  # the spare serves meanwhile (a retry when a pick tries the dead)
            assert backend_of_one() == "spare"

        restarted = LlamaServer(engine_model, slots=1, ctx=2048, threads=1, alias="tiny-llama",
                                port=port, log_path=tmp_path / "engine-third-again.log",
                                binary=llama_server_bin).start()
        wait_for("the backend back once its engine answers again",
                 lambda: not admin_stats(gw)["pools"]["kill"]["backends"]["third"]["ejected"],
                 timeout=20, interval=0.1)
        assert backend_of_one() == "third"
        # the ejection is counted (``gateway_ejections_total``), whichever path ejected it:
        # the broken stream's outcome or the failed health probe
        text = gateway_metrics(gw)
        assert (_series(text, "gateway_ejections_total", pool="kill", backend="third") or 0) >= 1
    finally:
        gw.stop()
        if restarted is not None:
            restarted.stop()
