"""The backend's own token figures, read from a response body or an SSE event, in one shape.

Backends report usage in three shapes, and the cache figures mean different things in each.
Reading them into :class:`BackendUsage` is where a gateway either counts cached tokens once or,
as many peer projects did, twice (priced inside the prompt total at the input rate *and* beside
it at the cached rate). The rules here, per shape, from each API's documented semantics:

**OpenAI chat/completions/embeddings** (:class:`WireUsage`, ``shape="openai"``): the totals are
``prompt_tokens`` and ``completion_tokens``, and every cache figure is a *part* of
``prompt_tokens``, never added to it:

* ``prompt_tokens_details.cached_tokens`` (OpenAI, vLLM, xAI, OpenRouter, LiteLLM) is the cache
  read; so are the top-level ``cache_read_input_tokens`` that LiteLLM and other OpenAI-compatible
  proxies copy beside it from Anthropic and DeepSeek's ``prompt_cache_hit_tokens``
  (DeepSeek documents ``prompt_tokens = prompt_cache_hit_tokens + prompt_cache_miss_tokens``).
  They are aliases of one count: the largest is taken, they are never summed.
* the cache write is ``prompt_tokens_details.cache_write_tokens`` (OpenRouter),
  ``prompt_tokens_details.cache_creation_tokens`` (LiteLLM) or the top-level
  ``cache_creation_input_tokens`` (Anthropic-style field on an OpenAI-shaped answer, where the
  proxy's ``prompt_tokens`` already includes it, as LiteLLM's does): again the largest alias.
* ``completion_tokens_details.reasoning_tokens`` is a part of ``completion_tokens``.
* a DeepSeek answer without ``prompt_tokens`` gets hit + miss as its prompt total.

**Anthropic Messages** (:class:`AnthropicUsage`, ``shape="anthropic"``): ``input_tokens``
*excludes* the cache: it is the input neither read from nor written to the cache, so the prompt
total is ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens`` (the write
falls back to the sum of ``cache_creation.ephemeral_5m/1h_input_tokens`` when only those are
given). ``output_tokens`` includes any thinking; Anthropic reports no reasoning split, so
reasoning is 0.

**OpenAI Responses** (:class:`ResponsesUsage`, ``shape="responses"``): ``input_tokens``
includes ``input_tokens_details.cached_tokens`` (the read) and
``input_tokens_details.cache_write_tokens`` (the write), ``output_tokens`` includes
``output_tokens_details.reasoning_tokens``; the same rule as chat under other names.

Whatever the shape, the result keeps the bucket invariants: ``cached_tokens + cache_write_tokens
<= prompt_tokens`` and ``reasoning_tokens <= completion_tokens``. A sub-count that breaks them is
clamped, not trusted: a negative detail reads as 0, a cache read above the prompt total is cut to
it, a cache write to what the read left, reasoning to the completion total. A *total* that is
negative or not an integer (``prompt_tokens``, ``completion_tokens``, ``input_tokens`` ...) makes
the whole usage untrustworthy: it yields None and the caller counts the tokens itself, as it does
for a body that is not JSON. A figure that is missing or null reads as 0.

Decoding goes through small msgspec Structs that name only the fields we need: msgspec skips the
rest (ids, choices, logprobs) without building Python objects for them, so reading ``usage`` from
a large completion is one fast pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "AnthropicUsage",
    "BackendUsage",
    "ResponsesUsage",
    "Shape",
    "WireUsage",
    "text_from_body",
    "usage_from_body",
    "usage_from_mapping",
]

#: a total: a negative one is malformed usage (None, counted by the gateway instead)
Count = Annotated[int, msgspec.Meta(ge=0)]

#: the usage shapes a backend answers in
Shape = Literal["openai", "anthropic", "responses"]


class BackendUsage(msgspec.Struct, frozen=True, kw_only=True):
    """What the backend reported, in one shape whatever it answered in.

    ``cached_tokens`` (cache read) and ``cache_write_tokens`` are disjoint parts of
    ``prompt_tokens``; ``reasoning_tokens`` is a part of ``completion_tokens``.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


def _buckets(
    prompt: int, completion: int, total: int, cached: int, cache_write: int, reasoning: int
) -> BackendUsage:
    """The figures clamped so the buckets stay valid (see the module docstring)."""
    cached = min(max(0, cached), prompt)
    return BackendUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cached_tokens=cached,
        cache_write_tokens=min(max(0, cache_write), prompt - cached),
        reasoning_tokens=min(max(0, reasoning), completion),
    )


def _largest(*aliases: int | None) -> int:
    """One count reported under several names: the largest given, 0 if none."""
    return max((a for a in aliases if a is not None), default=0)


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None
    #: OpenRouter's name for the cache write
    cache_write_tokens: int | None = None
    #: LiteLLM's name for the cache write
    cache_creation_tokens: int | None = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class WireUsage(msgspec.Struct):
    """``usage`` of an OpenAI-shaped answer (any field may be absent or null)."""

    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    total_tokens: Count | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    #: Anthropic-style names some OpenAI-compatible proxies add; parts of ``prompt_tokens``
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    #: DeepSeek's split of ``prompt_tokens``
    prompt_cache_hit_tokens: int | None = None
    prompt_cache_miss_tokens: int | None = None

    def normalise(self) -> BackendUsage:
        details = self.prompt_tokens_details or _PromptDetails()
        hit = self.prompt_cache_hit_tokens
        prompt = self.prompt_tokens
        if prompt is None:
            given = [max(0, n) for n in (hit, self.prompt_cache_miss_tokens) if n is not None]
            prompt = sum(given)
        completion = self.completion_tokens or 0
        out_details = self.completion_tokens_details
        return _buckets(
            prompt,
            completion,
            self.total_tokens or 0,
            _largest(details.cached_tokens, self.cache_read_input_tokens, hit),
            _largest(details.cache_write_tokens, details.cache_creation_tokens,
                     self.cache_creation_input_tokens),
            (out_details.reasoning_tokens or 0) if out_details is not None else 0,
        )


class _CacheCreation(msgspec.Struct):
    ephemeral_5m_input_tokens: int | None = None
    ephemeral_1h_input_tokens: int | None = None


class AnthropicUsage(msgspec.Struct):
    """``usage`` of an Anthropic Messages answer; ``input_tokens`` excludes the cache."""

    input_tokens: Count | None = None
    output_tokens: Count | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    #: the write by cache lifetime; their sum is ``cache_creation_input_tokens``
    cache_creation: _CacheCreation | None = None

    def normalise(self) -> BackendUsage:
        read = max(0, self.cache_read_input_tokens or 0)
        write = self.cache_creation_input_tokens
        if write is None and self.cache_creation is not None:
            by_ttl = self.cache_creation
            write = (max(0, by_ttl.ephemeral_5m_input_tokens or 0)
                     + max(0, by_ttl.ephemeral_1h_input_tokens or 0))
        write = max(0, write or 0)
        prompt = (self.input_tokens or 0) + read + write  # three disjoint parts
        completion = self.output_tokens or 0
        return _buckets(prompt, completion, prompt + completion, read, write, 0)


class _InputDetails(msgspec.Struct):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class _OutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class ResponsesUsage(msgspec.Struct):
    """``usage`` of an OpenAI Responses answer; the details are parts of the totals."""

    input_tokens: Count | None = None
    output_tokens: Count | None = None
    total_tokens: Count | None = None
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None

    def normalise(self) -> BackendUsage:
        details = self.input_tokens_details
        out_details = self.output_tokens_details
        return _buckets(
            self.input_tokens or 0,
            self.output_tokens or 0,
            self.total_tokens or 0,
            (details.cached_tokens or 0) if details is not None else 0,
            (details.cache_write_tokens or 0) if details is not None else 0,
            (out_details.reasoning_tokens or 0) if out_details is not None else 0,
        )


_WIRE: dict[str, type[WireUsage | AnthropicUsage | ResponsesUsage]] = {
    "openai": WireUsage,
    "anthropic": AnthropicUsage,
    "responses": ResponsesUsage,
}


class _UsageBody(msgspec.Struct):
    usage: WireUsage | None = None


class _AnthropicBody(msgspec.Struct):
    usage: AnthropicUsage | None = None


class _ResponsesBody(msgspec.Struct):
    usage: ResponsesUsage | None = None


_decode_openai = msgspec.json.Decoder(_UsageBody).decode
_decode_anthropic = msgspec.json.Decoder(_AnthropicBody).decode
_decode_responses = msgspec.json.Decoder(_ResponsesBody).decode


def usage_from_body(body: bytes, shape: Shape = "openai") -> BackendUsage | None:
    """``usage`` of a non-streamed answer (chat, completion, embeddings; a Messages or a
    Responses answer with ``shape``), or None when it has none or it is malformed."""
    wire: WireUsage | AnthropicUsage | ResponsesUsage | None
    try:
        if shape == "openai":
            wire = _decode_openai(body).usage
        elif shape == "anthropic":
            wire = _decode_anthropic(body).usage
        else:
            wire = _decode_responses(body).usage
    except msgspec.DecodeError:
        return None
    return None if wire is None else wire.normalise()


def usage_from_mapping(usage: Mapping[str, Any], shape: Shape = "openai") -> BackendUsage | None:
    """A ``usage`` object already parsed (e.g. from an Anthropic ``message_start`` event or a
    Responses ``response.completed`` event), or None when it is malformed."""
    try:
        wire = msgspec.convert(usage, _WIRE[shape])
    except msgspec.ValidationError:
        return None
    return wire.normalise()


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    text: str | None = None


class _TextBody(msgspec.Struct):
    choices: list[_Choice] | None = None


_decode_text = msgspec.json.Decoder(_TextBody).decode


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
