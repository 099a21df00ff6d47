"""The coding agents on a real engine: each agent's one-shot prompt through the gateway to
llama.cpp's llama-server (the tiny model of ``tests/engines``), not the simulator.

The demo's policy with both pools on one llama-server (``engine: llamacpp``, the engine's own
model name ``tiny-llama`` behind the public ``demo-chat``): each agent's first request as it
sends it (Claude Code's ~20k-token system prompt and tools over Messages, Codex's over
Responses, opencode's and aider's over chat completions) is translated to the engine's chat
completions, answered, and the agent exits 0 printing the answer. The tiny model's weights are
random, so the server's default grammar (``--grammar``) holds each answer to one sentence,
which the model then ends itself (its stop, not a length limit: an agent treats an answer cut
at its ``max_tokens`` as an error). What is checked is that the agent got the answer whole and
printed it, and that every request it made has its usage record with the engine's counts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.engines.build import EngineNotBuilt, build_engine, find_server_binary
from loadtest.engines.llama_server import LlamaServer
from loadtest.engines.tiny_model import TinyModelSpec, tiny_model_path
from tests.agents.harness import (
    AGENTS,
    admin_gateway,
    agents_policy,
    answer_text,
    usage_records,
)
from tests.agents.proxy import RecordingProxy
from tests.agents.test_agents import final_answer, refused, run, words
from tests.helpers import GatewayProcess
from tests.process_marker import starts_process

pytestmark = [pytest.mark.agents, pytest.mark.engine, pytest.mark.process,
              pytest.mark.timeout(600)]

ENGINE_MODEL = "tiny-llama"
#: what the engine answers (its grammar allows nothing else)
ANSWER = "Hello from the engine."


@pytest.fixture(scope="module")
@starts_process
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama-server: one slot of 32k tokens (Claude Code's first prompt is ~20k), two
    threads, answers held to ``ANSWER`` by the default grammar."""
    binary = find_server_binary()
    if binary is None:
        if os.environ.get("CI", "").lower() not in ("1", "true", "yes") and \
                os.environ.get("GATEWAY_ENGINE_BUILD") != "1":
            pytest.skip("llama-server is not built: run `make llama-server`")
        try:
            binary = build_engine()
        except EngineNotBuilt as exc:
            pytest.fail(str(exc))
    logs = tmp_path_factory.mktemp("agents-engine")
    # the model declares a 32k context (the default tiny model 4k: the engine caps its context
    # there, and Codex's first request is ~5k tokens)
    with LlamaServer(tiny_model_path(TinyModelSpec(context=32768)), slots=1, ctx=32768, threads=2,
                     alias=ENGINE_MODEL, log_path=logs / "engine.log", binary=binary,
                     extra_args=["--grammar", f'root ::= "{ANSWER}"']) as server:
        yield server


@pytest.fixture(scope="module")
@starts_process
def gateway(engine: LlamaServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayProcess]:
    data = agents_policy(engine.url, engine.url)
    for pool in data["pools"]:
        pool["engine"] = "llamacpp"
    for model in data["models"]:
        model["backend_model"] = ENGINE_MODEL
    with admin_gateway(tmp_path_factory.mktemp("agents-engine-gateway"), data) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def proxy(gateway: GatewayProcess) -> Iterator[RecordingProxy]:
    with RecordingProxy(gateway.url) as p:
        yield p


@pytest.mark.parametrize("agent", AGENTS)
def test_one_shot_prompt_on_llamacpp(agent: str, binary: Path, proxy: RecordingProxy,
                                     gateway: GatewayProcess, tmp_path: Path) -> None:
    fin, _ = run(agent, binary, proxy, tmp_path, "Say hello in one short sentence.",
                 tools=False, timeout=300)
    assert fin.exchanges, "no request reached the gateway:\n" + fin.report()
    assert not refused(fin), "the gateway refused requests:\n" + fin.report()
    assert fin.returncode == 0, fin.report()
    answer = final_answer(fin)
    text = answer_text(answer)
    assert words(text) == ANSWER, fin.report()
    assert ANSWER in words(fin.stdout), (
        f"the answer is not in the output:\n{text!r}\n" + fin.report())
    ids = {ex.request_id for ex in fin.exchanges if ex.status == 200 and ex.request_id}
    records = usage_records(gateway, ids)
    assert set(records) == ids, fin.report()
    for record in records.values():
        assert record["prompt_total"] > 0 and record["output"] > 0, record
        assert record["pool"] in {"interactive", "batch"} and not record["estimated"], record
