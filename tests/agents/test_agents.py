"""Coding agents work unchanged through the gateway (issue 40).

Each agent (Claude Code over Messages, Codex CLI over Responses, opencode and aider over chat
completions), installed from its registry at a pinned version, runs non-interactively against
``gateway serve`` on the demo's policy and simulators, set up as README's "Coding agents"
section says (``tests/agents/harness.py``), through a recording proxy:

* a one-shot prompt exits 0 and prints the simulator's answer;
* a tool loop runs to the end: the simulator calls the first tool the agent offers (its shell:
  the call's command is the string ``sim``), the agent runs it (a ``sim`` command on its PATH
  prints a marker) and sends the result back, and the answer after it ends the turn;
* every request the gateway answered has its usage record, whose buckets (prompt, output,
  cache read and write, reasoning) are what the answer told the agent;
* a key over its ``rpm`` limit gets 429 with ``Retry-After`` (and the ``x-ratelimit-*``
  headers) in the agent's API, and the agent waits as told rather than retrying at once;
* a key at its ``concurrency`` limit gets 429 with ``Retry-After: 1``: the agent retries after
  it (never sooner) and finishes once the slot is free.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.agents.harness import (
    AGENTS,
    Finished,
    Holder,
    agent_run,
    answer_calls,
    answer_text,
    answer_usage,
    api_of,
    fill_rpm,
    limit_key,
    run_agent,
    tool_results,
    usage_records,
)
from tests.agents.proxy import Exchange, RecordingProxy
from tests.helpers import TEST_KEY, GatewayProcess

pytestmark = [pytest.mark.agents, pytest.mark.process, pytest.mark.timeout(300)]

ONE_SHOT = "Say hello in one short sentence."
TOOL_PROMPT = "Run the shell command `sim` and tell me what it printed."
#: the record's bucket for each figure of ``answer_usage``
RECORD_FIELD = {"prompt": "prompt_total", "output": "output", "cached": "cached",
                "cache_write": "cache_write", "reasoning": "reasoning"}


def words(text: str) -> str:
    return " ".join(text.split())


def run(agent: str, binary: Path, proxy: RecordingProxy, tmp: Path, prompt: str, *,
        key: str = TEST_KEY, tools: bool = True, timeout: float = 120,
        max_requests: int = 40, **kw: Any) -> tuple[Finished, str]:
    """One run of ``agent`` in a fresh HOME and work dir; a ``sim`` command on its PATH
    prints a marker (returned beside the run)."""
    home, work, bin_dir = tmp / "home", tmp / "work", tmp / "bin"
    for d in (home, work, bin_dir):
        d.mkdir(parents=True, exist_ok=True)
    marker = f"tool-ran-{uuid.uuid4().hex[:12]}"
    sim = bin_dir / "sim"
    sim.write_text(f"#!/bin/sh\necho {marker}\n")
    sim.chmod(0o755)
    spec = agent_run(agent, binary, proxy.url, key, prompt, home, [bin_dir], tools=tools)
    return run_agent(agent, spec, proxy, work, timeout=timeout, max_requests=max_requests,
                     **kw), marker


def final_answer(fin: Finished) -> Exchange:
    """The last answered request whose answer is text (the turn's end)."""
    texts = [ex for ex in fin.exchanges
             if ex.status == 200 and answer_text(ex) and not answer_calls(ex)]
    assert texts, "no answer with text:\n" + fin.report()
    return texts[-1]


def same_turn(a: Exchange, b: Exchange) -> bool:
    """Whether two requests carry the same conversation (a retry may change other fields:
    Codex's ``client_metadata``)."""
    def turn(ex: Exchange) -> Any:
        body = ex.json()
        return (ex.path, body.get("messages"), body.get("input")) if isinstance(
            body, dict) else ex.body
    return bool(turn(a) == turn(b))


def refused(fin: Finished) -> list[Exchange]:
    return [ex for ex in fin.exchanges if ex.status != 200]


@pytest.mark.parametrize("agent", AGENTS)
def test_one_shot_prompt_exits_0_with_the_answer(agent: str, binary: Path,
                                                 proxy: RecordingProxy, tmp_path: Path) -> None:
    fin, _ = run(agent, binary, proxy, tmp_path, ONE_SHOT, tools=False)
    assert fin.exchanges, "no request reached the gateway:\n" + fin.report()
    assert not refused(fin), "the gateway refused requests:\n" + fin.report()
    assert fin.returncode == 0, fin.report()
    text = answer_text(final_answer(fin))
    assert words(text) in words(fin.stdout), (
        f"the answer is not in the output:\n{text!r}\n" + fin.report())


@pytest.mark.parametrize("agent", AGENTS)
def test_tool_loop_runs_to_the_end(agent: str, binary: Path, proxy: RecordingProxy,
                                   tmp_path: Path) -> None:
    if agent == "aider":
        pytest.skip("aider offers the model no tools (its edits are text blocks in the "
                    "answer), so it has no tool loop")
    fin, marker = run(agent, binary, proxy, tmp_path, TOOL_PROMPT)
    calls = [(i, answer_calls(ex)) for i, ex in enumerate(fin.exchanges) if answer_calls(ex)]
    assert calls, "the simulator called no tool:\n" + fin.report()
    sent_back = [i for i, ex in enumerate(fin.exchanges)
                 if any(marker in r for r in tool_results(ex))]
    results = [r[:200] for ex in fin.exchanges for r in tool_results(ex)]
    assert sent_back, (
        f"no request sent back the output of the `sim` command ({marker}); tools called "
        f"(request #, names): {calls[:5]}; tool results sent: {results[:5]}\n" + fin.report())
    after = fin.exchanges[sent_back[0]]
    assert after.status == 200 and answer_text(after) and not answer_calls(after), (
        "the answer after the tool result is not text:\n" + fin.report())
    assert not refused(fin), "the gateway refused requests:\n" + fin.report()
    assert fin.returncode == 0, fin.report()
    assert words(answer_text(final_answer(fin))) in words(fin.stdout), fin.report()


@pytest.mark.parametrize("agent", AGENTS)
def test_every_request_has_its_usage_record(agent: str, binary: Path, proxy: RecordingProxy,
                                            gateway: GatewayProcess, tmp_path: Path) -> None:
    fin, _ = run(agent, binary, proxy, tmp_path, TOOL_PROMPT, max_requests=12)
    answered = [ex for ex in fin.exchanges if ex.status == 200]
    assert answered, "the gateway answered no request:\n" + fin.report()
    assert all(ex.request_id for ex in answered), "an answer without x-request-id"
    ids = {ex.request_id for ex in answered if ex.request_id}
    records = usage_records(gateway, ids)
    missing = sorted(ids - set(records))
    assert not missing, f"no usage record for {missing}:\n" + fin.report()
    wrong = []
    for ex in answered:
        rec = records[ex.request_id or ""]
        for field in ("cached", "cache_write", "reasoning", "output", "prompt_total"):
            assert isinstance(rec.get(field), int), (field, rec)
        if rec["api"] != api_of(ex) or rec["model"] != "demo-chat" or rec["tenant"] != "demo":
            wrong.append((ex.request_id, "api/model/tenant", rec["api"], rec["model"]))
        told = answer_usage(ex)
        for figure, value in told.items():
            if rec[RECORD_FIELD[figure]] != value:
                wrong.append((ex.request_id, figure, rec[RECORD_FIELD[figure]], value))
    assert not wrong, f"records that differ from the answers (id, what, record, answer): {wrong}"
    if len(answered) > 1:
        # every request of a session re-sends the same system prompt and tools: the
        # simulator's prefix cache (vLLM's) serves them, and the cache bucket shows it
        assert any(records[i]["cached"] > 0 for i in ids), [
            {k: records[i][k] for k in ("prompt_total", "cached", "cache_write")} for i in ids]


@pytest.mark.parametrize("agent", AGENTS)
def test_key_over_its_rpm_limit_gets_429_with_retry_after(
        agent: str, binary: Path, proxy: RecordingProxy, gateway: GatewayProcess,
        tmp_path: Path) -> None:
    key = limit_key("tight", agent)
    fill_rpm(gateway, key)
    fin, _ = run(agent, binary, proxy, tmp_path, ONE_SHOT, key=key, tools=False, timeout=12)
    assert fin.exchanges, "no request reached the gateway:\n" + fin.report()
    first = fin.exchanges[0]
    assert first.status == 429, fin.report()
    retry_after = int(first.answer_headers["retry-after"])
    assert 30 <= retry_after <= 60, first.answer_headers
    assert first.answer_headers.get("x-ratelimit-limit-requests") == "1", first.answer_headers
    assert first.answer_headers.get("x-ratelimit-remaining-requests") == "0"
    body = json.loads(first.answer_text())
    if api_of(first) == "messages":  # Anthropic's error shape, which its SDK maps to 429
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    else:
        assert body["error"]["type"] == "rate_limit_error", body
        assert body["error"]["code"] == "rate_limit_exceeded", body
    # the agent waits as told: nothing more after its first requests (parallel ones at start)
    early = [ex for ex in fin.exchanges if ex.started - first.started > 2.0]
    assert not early, "retried before Retry-After:\n" + fin.report()
    assert fin.returncode != 0, "exited 0 though refused:\n" + fin.report()


@pytest.mark.parametrize("agent", AGENTS)
def test_agent_retries_after_retry_after_and_finishes(
        agent: str, binary: Path, proxy: RecordingProxy, gateway: GatewayProcess,
        tmp_path: Path) -> None:
    key = limit_key("narrow", agent)
    with Holder(gateway, key) as holder:
        def release(exchanges: list[Exchange]) -> None:
            # free the slot 1.2 s after the first refusal: the first retry (>= 1 s) may be
            # refused too, and a request the agent sends beside the first (opencode's title
            # and turn) is refused as well
            first = next((ex for ex in exchanges if ex.status == 429), None)
            if first is not None and time.monotonic() - first.started > 1.2:
                holder.release()

        fin, _ = run(agent, binary, proxy, tmp_path, ONE_SHOT, key=key, tools=False,
                     timeout=90, on_poll=release)
    refusals = [ex for ex in fin.exchanges if ex.status == 429]
    assert refusals, "never refused while the slot was held:\n" + fin.report()
    assert refusals[0].answer_headers.get("retry-after") == "1", refusals[0].answer_headers
    retried = []
    for refused_ex in refusals:
        # a retry is the same request again, sent no sooner than Retry-After said; an agent
        # may drop a background request instead (opencode its title, when the turn ends first)
        again = [ex for ex in fin.exchanges
                 if same_turn(ex, refused_ex) and ex.started > refused_ex.started]
        if again:
            waited = again[0].started - refused_ex.started
            assert waited >= 0.8, f"retried {waited:.2f} s after Retry-After: 1:\n" + fin.report()
            retried += again
    assert any(ex.status == 200 for ex in retried), "no retry succeeded:\n" + fin.report()
    assert fin.returncode == 0, fin.report()
