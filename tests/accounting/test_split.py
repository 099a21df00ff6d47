"""The input split: parts sum to OpenAI's count, history grows exactly, the cache is used."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.accounting.split as split_module
from gateway.accounting import PromptCounter
from gateway.accounting.messages import count_message, message_key
from gateway.tokenizers import REPLY_PRIMING, count_chat_prompt, get_encoding

ENCODINGS = ["o200k_base", "cl100k_base"]
text = st.text(max_size=60)
plain_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
        "content": text,
    },
    optional={"name": st.text(alphabet="abcxyz_", min_size=1, max_size=8)},
)


@pytest.fixture(scope="module", params=ENCODINGS)
def counter(request: pytest.FixtureRequest) -> PromptCounter:
    return PromptCounter(request.param, cache_size=10_000)


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(plain_message, max_size=8))
def test_parts_sum_to_openai_count(messages: list[dict[str, Any]]) -> None:
    """For plain messages system + history + new equals count_chat_prompt; no part is negative."""
    for name in ENCODINGS:
        split = PromptCounter(name).count_chat({"messages": messages})
        assert split.total == count_chat_prompt(messages, name)
        assert min(split.system, split.history, split.new, split.tools) >= 0
        assert split.tools == 0


def test_roles_go_to_their_parts(counter: PromptCounter) -> None:
    """System/developer anywhere -> system; up to the last assistant -> history; after -> new."""
    enc = get_encoding(counter.encoding).encode_ordinary
    m = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "developer", "content": "no emoji"},
        {"role": "user", "content": "and now?"},
    ]
    split = counter.count_chat({"messages": m})

    def c(i: int) -> int:
        return count_message(m[i], enc)[0]

    assert (split.system, split.history, split.new) == (
        c(0) + c(3),
        c(1) + c(2),
        c(4) + REPLY_PRIMING,
    )


def test_no_assistant_means_all_new(counter: PromptCounter) -> None:
    split = counter.count_chat({"messages": [{"role": "user", "content": "a"}] * 3})
    assert split.history == 0 and split.new == 3 * (3 + 1 + 1) + REPLY_PRIMING


@settings(max_examples=60, deadline=None)
@given(
    system=st.one_of(st.none(), text),
    turns=st.lists(st.tuples(text, text), min_size=1, max_size=6),
)
def test_history_grows_by_last_turn_exactly(
    system: str | None, turns: list[tuple[str, str]]
) -> None:
    """Turn by turn (user, assistant, user, ...): with the priming counted in ``new``,

    history[n+1] == history[n] + (new[n] - REPLY_PRIMING) + tokens(reply[n]), and system is fixed.
    """
    counter = PromptCounter()
    enc = get_encoding().encode_ordinary
    messages: list[dict[str, Any]] = (
        [] if system is None else [{"role": "system", "content": system}]
    )
    previous = None
    for user, reply in turns:
        messages.append({"role": "user", "content": user})
        split = counter.count_chat({"messages": list(messages)})
        if previous is None:
            assert split.history == 0
        else:
            prev_split, prev_reply = previous
            reply_tokens = count_message(prev_reply, enc)[0]
            expected = prev_split.history + prev_split.new - REPLY_PRIMING + reply_tokens
            assert split.history == expected
            assert split.system == prev_split.system
        answer = {"role": "assistant", "content": reply}
        messages.append(answer)
        previous = (split, answer)


def _conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You answer in prose."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + "why " * (i % 7)})
        messages.append({"role": "assistant", "content": f"answer {i} " + "because " * (i % 5)})
    return messages


class _Recorder:
    """An encoding whose ``encode_ordinary`` records the texts it was given."""

    def __init__(self, name: str) -> None:
        self._enc = get_encoding(name)
        self.texts: list[str] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.texts.append(text)
        return list(self._enc.encode_ordinary(text))


@pytest.mark.parametrize("remember", [False, True], ids=["reply-counted-next-turn", "remembered"])
def test_turn_50_tokenises_only_new_text(monkeypatch: pytest.MonkeyPatch, remember: bool) -> None:
    """At turn 50 the tokenizer sees the new user turn (and the last reply, unless it was
    remembered when delivered), never the 98 messages before them."""
    recorder = _Recorder("o200k_base")
    monkeypatch.setattr(split_module, "get_encoding", lambda name: recorder)
    counter = PromptCounter("o200k_base")
    conversation = _conversation(50)
    seen: list[str] = []
    for turn in range(1, 51):
        recorder.texts.clear()
        counter.count_chat({"messages": [dict(m) for m in conversation[: 2 * turn]]})
        seen = list(recorder.texts)
        if remember:
            counter.remember_reply(conversation[2 * turn]["content"])
    new_user = conversation[99]["content"]
    last_reply = conversation[98]["content"]
    expected = ["user", new_user] if remember else ["assistant", last_reply, "user", new_user]
    assert seen == expected


def test_remembered_reply_has_the_request_key() -> None:
    """remember_reply stores under the key of the message the client re-sends."""
    counter = PromptCounter()
    tokens = counter.remember_reply("Sure, here it is.")
    message = {"role": "assistant", "content": "Sure, here it is."}
    assert counter.cache.get(message_key(message)) == (tokens, 0)


def test_plain_key_matches_message_key() -> None:
    """The inlined fast key in the counting loop is message_key's (cache hits across paths)."""
    message = {"role": "user", "content": "x" * 50}
    assert message_key(message) == hash(("user", "x" * 50))


COOKBOOK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


@pytest.mark.parametrize(("encoding", "api"), [("o200k_base", 101), ("cl100k_base", 105)])
def test_tools_match_openai_cookbook(encoding: str, api: int) -> None:
    """The cookbook's example: the API reported 101 (gpt-4o) and 105 (gpt-4) prompt tokens."""
    split = PromptCounter(encoding).count_chat(
        {"messages": COOKBOOK_MESSAGES, "tools": COOKBOOK_TOOLS}
    )
    assert split.total == api


def test_legacy_functions_counted_like_tools() -> None:
    counter = PromptCounter()
    functions = [t["function"] for t in COOKBOOK_TOOLS]
    a = counter.count_chat({"messages": COOKBOOK_MESSAGES, "functions": functions})
    b = counter.count_chat({"messages": COOKBOOK_MESSAGES, "tools": COOKBOOK_TOOLS})
    assert a.tools == b.tools > 0


def test_tool_calls_and_tool_results(counter: PromptCounter) -> None:
    """An assistant tool call counts name + arguments; the tool's reply counts its content."""
    enc = get_encoding(counter.encoding).encode_ordinary
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "12C, rain"}
    assert count_message(call, enc)[0] == (
        3 + len(enc("assistant")) + len(enc("get_weather")) + len(enc('{"city":"Oslo"}'))
    )
    assert count_message(result, enc)[0] == 3 + len(enc("tool")) + len(enc("12C, rain"))
    split = counter.count_chat(
        {"messages": [{"role": "user", "content": "weather?"}, call, result]}
    )
    assert split.history == count_message(call, enc)[0] + 3 + 1 + len(enc("weather?"))
    assert split.new == count_message(result, enc)[0] + REPLY_PRIMING


def test_content_parts_and_images(counter: PromptCounter) -> None:
    """Text parts count as joined text; an image adds its fixed estimate and is flagged."""
    enc = get_encoding(counter.encoding).encode_ordinary
    parts = [
        {"type": "text", "text": "what is "},
        {"type": "image_url", "image_url": {"url": "data:...", "detail": "low"}},
        {"type": "text", "text": "in this picture?"},
        {"type": "input_audio", "input_audio": {"data": "...", "format": "wav"}},
    ]
    split = counter.count_chat({"messages": [{"role": "user", "content": parts}]})
    assert split.new == 3 + 1 + len(enc("what is in this picture?")) + 85 + REPLY_PRIMING
    assert split.non_text_parts == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("hello world", 2, id="text"),
        pytest.param(["hello world", "hello"], 3, id="texts"),
        pytest.param([1, 2, 3, 4], 4, id="token-ids"),
        pytest.param([[1, 2], [3]], 3, id="token-id-lists"),
        pytest.param(None, 0, id="missing"),
    ],
)
def test_completion_and_embedding_input_is_all_new(value: Any, expected: int) -> None:
    counter = PromptCounter()
    assert counter.count_completion({"prompt": value}).new == expected
    assert counter.count_embedding({"input": value}).new == expected
    assert counter.count_embedding({"input": value}).total == expected


def test_garbage_is_tolerated() -> None:
    """Malformed messages are skipped, not fatal: counting never fails a request."""
    split = PromptCounter().count_chat({"messages": [1, "x", None, {"role": "user"}]})
    assert split.new == 3 + 1 + REPLY_PRIMING
    assert PromptCounter().count_chat({"messages": "nope"}).total == REPLY_PRIMING
