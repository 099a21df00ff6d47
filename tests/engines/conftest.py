"""llama.cpp's ``llama-server`` on a tiny random llama model: two engines for the session.

``make test`` builds llama-server first (``make llama-server``, a no-op on a warm cache). Run
alone, these tests skip with the reason when it is not built, except under CI (``CI=true``) or
with ``GATEWAY_ENGINE_BUILD=1``: then it is built once, before the first test runs (outside any
test's timeout), and a failed build fails the tests.

``gateway`` is one ``gateway serve`` (a real process) in front of both engines for the session
(its pools and public models below); ``record_of`` reads a request's usage record through the
admin export, by the ``x-request-id`` the gateway answered with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from loadtest.engines.build import EngineNotBuilt, build_engine, find_server_binary
from loadtest.engines.llama_server import LlamaServer
from loadtest.engines.tiny_model import TinyModelSpec, tiny_model_path
from tests.helpers import TEST_KEY, TEST_KEY_SHA, GatewayProcess, wait_usage_records
from tests.process_marker import starts_process

ENGINE_MODEL = "tiny-llama"
"""The ``--alias`` the test engines answer with (the ``model`` of their answers)."""


def _must_build() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("GATEWAY_ENGINE_BUILD") == "1"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build before the tests run, so the build's minutes count against no test's timeout."""
    if _must_build() and find_server_binary() is None and any(
        item.get_closest_marker("engine") for item in session.items
    ):
        build_engine()


@pytest.fixture(scope="session")
@starts_process
def llama_server_bin() -> Path:
    """The cached llama-server: built if needed under CI, else the tests skip without it."""
    found = find_server_binary()
    if found is not None:
        return found
    if not _must_build():
        pytest.skip("llama-server is not built: run `make llama-server` (~10-15 min; "
                    "deploy/engines/build-llama-server.sh), or set GATEWAY_ENGINE_BUILD=1")
    try:
        return build_engine()
    except EngineNotBuilt as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def engine_model(llama_server_bin: Path) -> Path:
    """The default tiny model (embedding 256, 4 layers, GPT-2 vocab), written once (the vocab
    comes with the build)."""
    return tiny_model_path(TinyModelSpec())


@pytest.fixture(scope="session")
@starts_process
def llama_servers(
    llama_server_bin: Path, engine_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LlamaServer, LlamaServer]]:
    """Two engines on the same model, each 2 slots of 2,048 tokens on 1 thread (2 cores in all);
    the second also serves ``/v1/embeddings``. Logs in the session's temp dir."""
    logs = tmp_path_factory.mktemp("engines")

    def engine(name: str, *, embeddings: bool = False) -> LlamaServer:
        return LlamaServer(engine_model, slots=2, ctx=4096, threads=1, alias=ENGINE_MODEL,
                           embeddings=embeddings, log_path=logs / f"engine-{name}.log",
                           binary=llama_server_bin)

    with engine("a") as a, engine("b", embeddings=True) as b:
        yield a, b


@pytest.fixture(scope="session")
def llama_server(llama_servers: tuple[LlamaServer, LlamaServer]) -> LlamaServer:
    return llama_servers[0]


# --- the gateway as a real process in front of the two engines ------------------------------

ADMIN_TOKEN = "admin-engines-e2e"
CHAT_MODEL = "tiny-chat"
"""The public name of the chat model (the engines answer ``tiny-llama``)."""
EMBED_MODEL = "tiny-embed"
PREFIX_MODEL = "tiny-prefix"
SIGNALS_MODEL = "tiny-signals"


def engine_backend(name: str, server: LlamaServer, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": server.url, "max_in_flight": 4, **extra}


def engine_policy(pools: list[dict[str, Any]], models: list[dict[str, Any]]) -> dict[str, Any]:
    """A policy with the test key (tenant ``acme``), generous limits and these pools/models."""
    return {
        "server": {"drain_timeout": 5},
        "auth": {"keys": [{"id": "test", "sha256": TEST_KEY_SHA, "tenant": "acme"}]},
        "plans": [{"name": "p", "limits": {"rpm": 100_000}}],
        "tenants": [{"name": "acme", "plan": "p"}],
        "pools": pools,
        "models": models,
    }


def start_gateway(tmp: Path, data: dict[str, Any]) -> GatewayProcess:
    """``gateway serve`` with the admin token in its environment only."""
    gateway = GatewayProcess(tmp, data)
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN_TOKEN
    try:
        return gateway.start()
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


@pytest.fixture(scope="session")
@starts_process
def gateway(llama_servers: tuple[LlamaServer, LlamaServer],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the engine tests: pool ``chat`` (both engines; public model
    ``tiny-chat``), ``embed`` (the ``--embeddings`` engine), ``prefix`` (both engines,
    ``strategy: prefix``, ``cache_isolation: shared``) and ``signals`` (both engines, scraped
    every 0.25 s; no other traffic, so its latency averages stay empty)."""
    a, b = llama_servers
    both = [engine_backend("a", a), engine_backend("b", b)]
    health = {"path": "/health", "interval": 1.0}
    pools: list[dict[str, Any]] = [
        {"name": "chat", "engine": "llamacpp", "backends": both, "health": health,
         "signals": {"interval": 0.5}},
        {"name": "embed", "engine": "llamacpp", "backends": [engine_backend("b", b)]},
        {"name": "prefix", "engine": "llamacpp", "strategy": "prefix",
         "cache_isolation": "shared", "backends": both},
        {"name": "signals", "engine": "llamacpp", "backends": both,
         "signals": {"interval": 0.25, "timeout": 2.0}},
        # the wrong engine's names: nothing read, flagged as missing
        {"name": "signals-vllm", "engine": "vllm", "backends": [engine_backend("a", a)],
         "signals": {"interval": 0.25, "timeout": 2.0}},
    ]
    models = [{"name": name, "pool": pool, "backend_model": ENGINE_MODEL} for name, pool in (
        (CHAT_MODEL, "chat"), (EMBED_MODEL, "embed"), (PREFIX_MODEL, "prefix"),
        (SIGNALS_MODEL, "signals"), ("tiny-signals-vllm", "signals-vllm"))]
    gw = start_gateway(tmp_path_factory.mktemp("engine-gateway"), engine_policy(pools, models))
    try:
        yield gw
    finally:
        gw.stop()


def openai_client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0, timeout=60)


def anthropic_client(gw: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0, timeout=60)


def record_of(gw: GatewayProcess, request_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """The usage record of ``request_id`` (the gateway's ``x-request-id``), from the admin
    export; polled, since a record may reach the database just after its answer ends."""
    rows = wait_usage_records(
        gw.url, ADMIN_TOKEN, lambda rows: any(row["request_id"] == request_id for row in rows),
        within=timeout)
    found = [row for row in rows if row["request_id"] == request_id]
    assert found, f"no usage record for {request_id}"
    return found[0]


def admin_stats(gw: GatewayProcess) -> dict[str, Any]:
    r = httpx.post(gw.url + "/admin/stats", timeout=10,
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text
    stats: dict[str, Any] = r.json()
    return stats


def gateway_metrics(gw: GatewayProcess) -> str:
    r = httpx.get(gw.url + "/metrics", timeout=10)
    assert r.status_code == 200, r.text
    return r.text


def engine_metrics(server: LlamaServer) -> dict[str, float]:
    """llama-server's ``llamacpp:*`` metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {name: float(value) for name, _, value in
            (line.partition(" ") for line in text.splitlines() if line.startswith("llamacpp:"))}


def busy_slots(server: LlamaServer) -> int:
    status, slots = server.get("/slots")
    assert status == 200, slots
    return sum(1 for s in slots if s["is_processing"])


def wait_for(what: str, check: Callable[[], bool], timeout: float = 10.0,
             interval: float = 0.05) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` (a generous
    bound, never a measurement)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(interval)
