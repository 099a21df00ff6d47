"""``/sim/stats`` counts every API, and what the answers reported reconciles with the engine."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai

from gateway.sim.server import SimServer

USER: list[Any] = [{"role": "user", "content": "Count me."}]


def test_usage_of_every_api_reconciles_with_the_engine() -> None:
    with SimServer(speedup=10, jitter=0.0) as s:
        oc = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        ac = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        reported: list[tuple[int, int]] = []
        c = oc.chat.completions.create(model="m", messages=USER, max_tokens=4)
        assert c.usage is not None
        reported.append((c.usage.prompt_tokens, c.usage.completion_tokens))
        t = oc.completions.create(model="m", prompt="Once", max_tokens=3)
        assert t.usage is not None
        reported.append((t.usage.prompt_tokens, t.usage.completion_tokens))
        r = oc.responses.create(model="m", input="Count me.", max_output_tokens=5)
        assert r.usage is not None
        reported.append((r.usage.input_tokens, r.usage.output_tokens))
        done = [e for e in oc.responses.create(model="m", input="Again", stream=True)]
        final = done[-1].response  # type: ignore[union-attr]
        reported.append((final.usage.input_tokens, final.usage.output_tokens))
        system = [
            {"type": "text", "text": "Long rules. " * 40, "cache_control": {"type": "ephemeral"}}
        ]
        for _ in range(2):  # a cache write, then a read: both are prompt tokens
            m = ac.messages.create(model="m", max_tokens=6, system=system, messages=USER)  # type: ignore[arg-type]
            u = m.usage
            prompt = (
                u.input_tokens
                + (u.cache_read_input_tokens or 0)
                + (u.cache_creation_input_tokens or 0)
            )
            reported.append((prompt, u.output_tokens))
        with ac.messages.stream(model="m", max_tokens=7, messages=USER) as stream:
            fm = stream.get_final_message()
        reported.append((fm.usage.input_tokens, fm.usage.output_tokens))
        e = oc.embeddings.create(model="m", input="vector")
        stats = s.stats()
        assert stats["prompt_tokens_total"] == sum(p for p, _ in reported)
        assert (
            stats["generated_tokens_total"]
            == sum(o for _, o in reported)
            == 4 + 3 + 5 + 64 + 6 + 6 + 7
        )
        apis = stats["apis"]
        assert {k: v["answered"] for k, v in apis.items()} == {
            "chat": 1, "completions": 1, "responses": 2, "messages": 3, "embeddings": 1,
        }  # fmt: skip
        assert apis["messages"]["prompt_tokens"] == sum(p for p, _ in reported[4:7])
        assert apis["messages"]["cache_read_tokens"] == apis["messages"]["cache_write_tokens"] > 0
        assert apis["responses"]["output_tokens"] == 5 + 64
        assert apis["embeddings"]["prompt_tokens"] == e.usage.prompt_tokens
        assert httpx.get(s.url + "/sim/stats").json()["apis"] == apis
        # a refused request is received but not answered
        httpx.post(s.url + "/v1/messages", json={"model": "m", "messages": USER})
        after = s.stats()["apis"]["messages"]
        assert (after["requests"], after["answered"]) == (4, 3)
