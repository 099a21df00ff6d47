"""The conversation key is stable from the first turn, so a conversation keeps its version."""

from __future__ import annotations

import random

from gateway.config import Model, Version
from gateway.routing.conversation import conversation_key
from gateway.routing.versions import choose_version


def _turns(rng: random.Random, n: int, system: bool) -> list[list[dict[str, str]]]:
    """The message lists a chat client sends at turns 1..n of one conversation."""
    messages: list[dict[str, str]] = []
    if system:
        messages.append({"role": "system", "content": f"be brief {rng.random()}"})
    turns = []
    for t in range(n):
        messages.append({"role": "user", "content": f"question {t} {rng.random()}"})
        turns.append(list(messages))
        messages.append({"role": "assistant", "content": f"answer {t}"})
    return turns


def test_key_is_the_same_at_every_turn_with_or_without_system() -> None:
    rng = random.Random(5)
    keys = set()
    for i in range(200):
        turns = _turns(rng, 5, system=i % 2 == 0)
        first = conversation_key({"messages": turns[0]})
        assert first is not None
        assert all(conversation_key({"messages": m}) == first for m in turns[1:])
        keys.add(first)
    assert len(keys) == 200  # different conversations, different keys


def test_conversation_keeps_its_canary_version_across_turns() -> None:
    """The failure the key fixes: 21 of 200 conversations moved version at turn 2."""
    model = Model(name="m", pool="p", sticky="conversation",
                  versions=[Version(backend_model="v1", weight=50),
                            Version(backend_model="v2", weight=50)])
    rng = random.Random(9)
    for _ in range(200):
        turns = _turns(rng, 4, system=False)
        chosen = {choose_version(model, conversation_key({"messages": m})) for m in turns}
        assert len(chosen) == 1


def test_user_field_then_session_header_then_messages() -> None:
    messages = [{"role": "user", "content": "hi"}]
    by_user = conversation_key({"user": "u1", "messages": messages}, b"s1")
    assert by_user == conversation_key({"user": "u1"})
    by_session = conversation_key({"messages": messages}, b"s1")
    assert by_session == conversation_key({"messages": [*messages, *messages]}, b"s1")
    assert by_session != conversation_key({"messages": messages})
    assert conversation_key({}) is None
    assert conversation_key({"messages": messages}, b"x" * 1000) == conversation_key(
        {"messages": messages})  # an oversized session header is ignored
