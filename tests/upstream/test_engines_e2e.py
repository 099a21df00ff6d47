"""Engine quirks against real HTTP engines (issue 36, point 2).

Fake engines (``tests/fake_engine.py``, real aiohttp servers): a llama.cpp whose ``/metrics``
has llama.cpp's names is read into its backend's waiting, running and KV use, and its engine
is learnt from them when the policy names none; a source with none of its engine's names is
warned of once (not per scrape) and shown as ``gateway_engine_signals_missing 1`` by a real
gateway process; llama.cpp's ``exceed_context_size_error`` reaches an ``openai`` client as
OpenAI's 400 ``context_length_exceeded`` (a Responses client too, translated; an
``anthropic`` client as its 400), the message kept; and each engine is sent the prompt-cache
switch it takes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Backend, Pool, Signals, Timeouts
from gateway.http.client import H1Upstream
from gateway.routing.pool import PoolState
from gateway.upstream.monitors import Monitors
from tests.fake_engine import OVERFLOW, Engine, FakeEngines
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.process_marker import starts_process

LLAMACPP_METRICS = b"""# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
"""
#: a metrics page with no engine's names (an exporter's, or a proxy's)
UNRELATED = b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n"


async def _scraped(fake: FakeEngines, name: str, engine: str | None, times: int = 1
                   ) -> PoolState:
    pool = PoolState(Pool(name="p", signals=Signals(interval=0.05), backends=[
        Backend(url=fake.url(name), name=f"{name}-0", engine=engine)]))  # type: ignore[arg-type]
    upstream = H1Upstream(Timeouts())
    try:
        monitors = Monitors([pool], upstream)
        for _ in range(times):
            await monitors.scrape(pool, pool.backends[0])
    finally:
        await upstream.close()
    return pool


def test_llamacpp_metrics_are_the_backends_signals() -> None:
    with FakeEngines({"llama": Engine("/m/tiny.gguf", metrics=LLAMACPP_METRICS)}) as fake:
        for engine in (None, "llamacpp"):
            backend = asyncio.run(_scraped(fake, "llama", engine)).backends[0]
            assert (backend.engine_waiting, backend.engine_running,
                    backend.engine_kv_usage) == (3.0, 2.0, 0.25)
            assert not backend.signals_missing
            assert backend.detected_engine == ("llamacpp" if engine is None else None)


def test_a_source_without_its_names_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    engines = {"vllm": Engine("x", metrics=LLAMACPP_METRICS),  # not a vLLM's names
               "other": Engine("x", metrics=UNRELATED), "none": Engine("x", metrics=None)}
    with FakeEngines(engines) as fake, caplog.at_level(logging.WARNING, "gateway.health"):
        for name, engine in (("vllm", "vllm"), ("other", None), ("none", "llamacpp")):
            caplog.clear()
            backend = asyncio.run(_scraped(fake, name, engine, times=4)).backends[0]
            assert backend.signals_missing and backend.engine_waiting == 0.0
            warnings = [r.getMessage() for r in caplog.records
                        if "engine signals missing" in r.getMessage()]
            assert len(warnings) == 1 and f"backend {name}-0 of pool p" in warnings[0], warnings


# --- through a gateway process ----------------------------------------------------------------
ENGINES = {
    "llama": Engine("/models/tiny.gguf", metrics=LLAMACPP_METRICS),
    "silent": Engine("x", metrics=UNRELATED),
    "vllm": Engine("/data/served", style="python"),
    "hosted": Engine("gpt-x", style="python"),
}
POOL_ENGINE = {"llama": "llamacpp", "silent": None, "vllm": "vllm", "hosted": "openai"}


@pytest.fixture(scope="module")
@starts_process
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess,
                                                                    FakeEngines]]:
    tmp = tmp_path_factory.mktemp("engines")
    with FakeEngines(ENGINES) as fake:
        data = policy({name: [fake.url(name)] for name in ENGINES})
        data["auth"]["keys"][0]["tenant"] = "acme"
        for pool in data["pools"]:
            if POOL_ENGINE[pool["name"]] is not None:
                pool["engine"] = POOL_ENGINE[pool["name"]]
            if pool["name"] in ("llama", "silent"):
                pool["signals"] = {"path": "/metrics", "interval": 0.1}
        with GatewayProcess(tmp, data) as gateway:
            yield gateway, fake


def _gauge(gateway: GatewayProcess) -> dict[str, float]:
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    return {sample.labels["pool"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "gateway_engine_signals_missing"}


def test_missing_signals_show_in_metrics_and_warn_once(
        gw: tuple[GatewayProcess, FakeEngines]) -> None:
    gateway, _ = gw
    deadline = time.monotonic() + 30
    while True:
        seen = _gauge(gateway)
        if (seen.get("silent") == 1.0 and "llama" in seen and ENGINES["silent"].scrapes >= 5) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen == {"silent": 1.0, "llama": 0.0}
    assert ENGINES["silent"].scrapes >= 5
    lines = [line for line in gateway.output().splitlines() if "engine signals missing" in line]
    assert len(lines) == 1 and "backend silent-0 of pool silent" in lines[0], lines


def test_llamacpp_context_error_is_openais(gw: tuple[GatewayProcess, FakeEngines]) -> None:
    gateway, _ = gw
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TEST_KEY, max_retries=0)
    big = [{"role": "user", "content": f"{OVERFLOW} a very long prompt"}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="llama-model", messages=big,  # type: ignore[arg-type]
                                           stream=stream)
        error = caught.value
        assert error.status_code == 400 and error.code == "context_length_exceeded"
        assert error.type == "invalid_request_error"
        assert "exceeds the available context size" in error.message
    with pytest.raises(openai.BadRequestError) as responses:  # translated to chat and back
        client.responses.create(model="llama-model", input=big[0]["content"], store=False)
    assert responses.value.code == "context_length_exceeded"
    assert "exceeds the available context size" in responses.value.message
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=TEST_KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as translated:
        claude.messages.create(model="llama-model", max_tokens=8, messages=big)  # type: ignore[arg-type]
    assert "exceeds the available context size" in str(translated.value)


def test_each_engine_gets_the_cache_switch_it_takes(
        gw: tuple[GatewayProcess, FakeEngines]) -> None:
    gateway, _ = gw
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TEST_KEY}"},
                      timeout=30) as http:
        for name in ENGINES:
            r = http.post("/v1/chat/completions", json={
                "model": f"{name}-model", "cache_salt": "mine", "cache_prompt": True,
                "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
    sent: dict[str, dict[str, Any]] = {name: ENGINES[name].requests[-1] for name in ENGINES}
    assert sent["llama"].get("cache_prompt") is False and "cache_salt" not in sent["llama"]
    salt = sent["vllm"].get("cache_salt")
    assert isinstance(salt, str) and salt != "mine" and "cache_prompt" not in sent["vllm"]
    assert "cache_salt" not in sent["hosted"] and "cache_prompt" not in sent["hosted"]
    # unknown engine: the policy's isolation.cache (salt)
    assert sent["silent"].get("cache_salt") == salt and "cache_prompt" not in sent["silent"]
