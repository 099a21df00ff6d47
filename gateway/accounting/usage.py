"""The backend's own token figures, read from a response body or an SSE event.

Decoding goes through small msgspec Structs that name only the fields we need: msgspec skips the
rest (ids, choices, logprobs) without building Python objects for them, so reading ``usage`` from
a large completion is one fast pass. A figure that is missing or null reads as 0; a body that is
not JSON, or whose usage is malformed (negative or non-integer counts), yields None and the
caller falls back to counting.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["BackendUsage", "WireUsage", "text_from_body", "usage_from_body"]

Count = Annotated[int, msgspec.Meta(ge=0)]


class _PromptDetails(msgspec.Struct):
    cached_tokens: Count | None = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: Count | None = None


class WireUsage(msgspec.Struct):
    """``usage`` as a backend sends it (any field may be absent or null)."""

    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    total_tokens: Count | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None

    def normalise(self) -> BackendUsage:
        details = self.prompt_tokens_details
        prompt = self.prompt_tokens or 0
        cached = (details.cached_tokens or 0) if details is not None else 0
        output = self.completion_tokens or 0
        out_details = self.completion_tokens_details
        reasoning = (out_details.reasoning_tokens or 0) if out_details is not None else 0
        return BackendUsage(
            prompt_tokens=prompt,
            completion_tokens=output,
            total_tokens=self.total_tokens or 0,
            cached_tokens=min(cached, prompt),
            reasoning_tokens=min(reasoning, output),
        )


class BackendUsage(msgspec.Struct, frozen=True, kw_only=True):
    """What the backend reported; cached (reasoning) tokens are part of prompt (completion)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class _UsageBody(msgspec.Struct):
    usage: WireUsage | None = None


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    text: str | None = None


class _TextBody(msgspec.Struct):
    choices: list[_Choice] | None = None


_decode_usage = msgspec.json.Decoder(_UsageBody).decode
_decode_text = msgspec.json.Decoder(_TextBody).decode


def usage_from_body(body: bytes) -> BackendUsage | None:
    """``usage`` of a non-streamed chat, completion or embeddings response, or None."""
    try:
        wire = _decode_usage(body).usage
    except msgspec.DecodeError:
        return None
    return None if wire is None else wire.normalise()


def text_from_body(body: bytes) -> str:
    """Generated text of a non-streamed response (all choices), to count when usage is absent."""
    try:
        choices = _decode_text(body).choices or []
    except msgspec.DecodeError:
        return ""
    texts: list[str] = []
    for choice in choices:
        if choice.message is not None and choice.message.content:
            texts.append(choice.message.content)
        elif choice.text:
            texts.append(choice.text)
    return "".join(texts)
