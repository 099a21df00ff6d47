"""llama.cpp's ``llama-server`` on a tiny random llama model: two engines for the session.

``make test`` builds llama-server first (``make llama-server``, a no-op on a warm cache). Run
alone, these tests skip with the reason when it is not built, except under CI (``CI=true``) or
with ``GATEWAY_ENGINE_BUILD=1``: then it is built once, before the first test runs (outside any
test's timeout), and a failed build fails the tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.engines.build import EngineNotBuilt, build_engine, find_server_binary
from loadtest.engines.llama_server import LlamaServer
from loadtest.engines.tiny_model import TinyModelSpec, tiny_model_path

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
