"""The simulator continues a final assistant message (vLLM's ``continue_final_message``, or
``add_generation_prompt: false``): the words after it, as the unbroken answer has them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.sim.completions import parse_completion
from gateway.sim.config import build_config

CFG = build_config()
BODY: dict[str, Any] = {"model": "m", "max_tokens": 10, "seed": 3,
                        "messages": [{"role": "user", "content": "hi"}]}


def _words(body: dict[str, Any]) -> tuple[list[str], str]:
    plan, _ = parse_completion(body, chat=True, model="m", cfg=CFG)
    return plan.words, plan.finish


def _continuing(prefix: str, limit: int | None, **flags: Any) -> dict[str, Any]:
    body = {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": prefix}],
            **flags}
    if limit is None:
        body.pop("max_tokens")
    else:
        body["max_tokens"] = limit
    return body


@pytest.mark.parametrize("flags", [{"continue_final_message": True},
                                   {"add_generation_prompt": False}], ids=["continue", "no-gen"])
@pytest.mark.parametrize("limited", [True, False], ids=["limit", "default-length"])
def test_a_continuation_gives_the_rest_of_the_answer(flags: dict[str, Any],
                                                     limited: bool) -> None:
    body = BODY if limited else {k: v for k, v in BODY.items() if k != "max_tokens"}
    whole, finish = _words(body)
    for k in range(1, len(whole)):
        prefix = "".join(whole[:k])
        rest, rest_finish = _words(_continuing(prefix, 10 - k if limited else None, **flags))
        assert whole[:k] + rest == whole, k
        assert rest_finish == finish


def test_a_final_assistant_message_alone_is_not_continued() -> None:
    """Without either flag an assistant message is history, as before."""
    whole, _ = _words(BODY)
    other, _ = _words(_continuing("".join(whole[:2]), 8))
    assert other != whole[2:]
