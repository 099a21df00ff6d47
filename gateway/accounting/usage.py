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
* llama.cpp builds from before its usage detail report the cache read only beside the usage,
  as ``timings.cache_n`` (a part of ``prompt_tokens`` too): read as one more alias of it;
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
<= prompt_tokens`` and ``reasoning_tokens <= completion_tokens``. A sub-count above its total is
cut to it, not trusted: a cache read above the prompt total is cut to it, a cache write to what
the read left, reasoning to the completion total (``overstated`` keeps the largest figure cut,
for the bound check). Every figure is first checked by ``usage_bounds.first_problem``: a total
that is null, absent where the shape requires it, not an integer (``1e30``, ``"12"``,
``true``) or negative, or a part that is not an integer or negative, gives a usage with
``rejected`` set (the reason) and every figure 0; so does a usage (or a detail object) that is
not a JSON object. The caller then counts the tokens itself, as it does for a body without
usage (None), and says why. A part that is missing or null reads as 0.

Decoding goes through small msgspec Structs that name only the fields we need: msgspec skips the
rest (ids, choices, logprobs) without building Python objects for them, so reading ``usage`` from
a large completion is one fast pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

from gateway.accounting.usage_bounds import MALFORMED, first_problem

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "AnthropicUsage",
    "BackendUsage",
    "ResponsesUsage",
    "Shape",
    "WireUsage",
    "checked_usage",
    "malformed_usage",
    "text_from_body",
    "usage_from_body",
    "usage_from_mapping",
]

#: the usage shapes a backend answers in
Shape = Literal["openai", "anthropic", "responses"]

_UNSET: Any = msgspec.UNSET


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
    #: the largest cache or reasoning figure reported above the total it is part of (and cut
    #: to it); 0 when none was: a figure far beyond the request's bounds refuses the usage
    overstated: int = 0
    #: why these figures cannot be billed (``usage_bounds``: ``"null:prompt_tokens"``, ...),
    #: every figure then 0; None: they were read without a problem
    rejected: str | None = None
    #: why a figure of these is the gateway's own, not the backend's, though it is billed as
    #: read: a continued stream's usage, spliced from two engines' (``continued:<fields>``,
    #: ``upstream/continuation.py``); None: every figure is the backend's
    estimated: str | None = None


def _refused(reason: str) -> BackendUsage:
    return BackendUsage(rejected=reason)


def _n(value: Any) -> int:
    """A figure already checked by ``first_problem``: its count, 0 when absent or null."""
    return value if type(value) is int else 0


def _buckets(
    prompt: int, completion: int, total: int, cached: int, cache_write: int, reasoning: int
) -> BackendUsage:
    """The figures cut so the buckets stay valid (see the module docstring)."""
    read = min(cached, prompt)
    write = min(cache_write, prompt - read)
    think = min(reasoning, completion)
    cut = [n for n, kept in ((cached, read), (cache_write, write), (reasoning, think))
           if n > kept]
    return BackendUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cached_tokens=read,
        cache_write_tokens=write,
        reasoning_tokens=think,
        overstated=max(cut, default=0),
    )


def _largest(*aliases: Any) -> int:
    """One count reported under several names: the largest given, 0 if none."""
    return max((_n(a) for a in aliases), default=0)


class _PromptDetails(msgspec.Struct):
    cached_tokens: Any = None
    #: OpenRouter's name for the cache write
    cache_write_tokens: Any = None
    #: LiteLLM's name for the cache write
    cache_creation_tokens: Any = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: Any = None


class WireUsage(msgspec.Struct):
    """``usage`` of an OpenAI-shaped answer; every figure as decoded (``UNSET``: absent), for
    ``usage_bounds.first_problem`` to judge."""

    prompt_tokens: Any = _UNSET
    completion_tokens: Any = _UNSET
    total_tokens: Any = _UNSET
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    #: Anthropic-style names some OpenAI-compatible proxies add; parts of ``prompt_tokens``
    cache_read_input_tokens: Any = None
    cache_creation_input_tokens: Any = None
    #: DeepSeek's split of ``prompt_tokens``
    prompt_cache_hit_tokens: Any = None
    prompt_cache_miss_tokens: Any = None

    def normalise(self, cache_n: Any = None) -> BackendUsage:
        """The figures in one shape; ``cache_n``: llama.cpp's ``timings.cache_n`` of the same
        answer, an alias of the cache read (ignored unless a count)."""
        details = self.prompt_tokens_details or _PromptDetails()
        out_details = self.completion_tokens_details or _CompletionDetails()
        hit, miss = self.prompt_cache_hit_tokens, self.prompt_cache_miss_tokens
        split = hit is not None or miss is not None  # DeepSeek: the prompt is hit + miss
        problem = first_problem(
            {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
             "total_tokens": self.total_tokens},
            {"cached_tokens": details.cached_tokens,
             "cache_write_tokens": details.cache_write_tokens,
             "cache_creation_tokens": details.cache_creation_tokens,
             "cache_read_input_tokens": self.cache_read_input_tokens,
             "cache_creation_input_tokens": self.cache_creation_input_tokens,
             "prompt_cache_hit_tokens": hit, "prompt_cache_miss_tokens": miss,
             "reasoning_tokens": out_details.reasoning_tokens},
            required=None if split else "prompt_tokens")
        if problem is not None:
            return _refused(problem)
        prompt = _n(self.prompt_tokens) if self.prompt_tokens is not _UNSET else (
            _n(hit) + _n(miss))
        return _buckets(
            prompt,
            _n(self.completion_tokens),
            _n(self.total_tokens),
            _largest(details.cached_tokens, self.cache_read_input_tokens, hit,
                     cache_n if type(cache_n) is int and cache_n >= 0 else None),
            _largest(details.cache_write_tokens, details.cache_creation_tokens,
                     self.cache_creation_input_tokens),
            _n(out_details.reasoning_tokens),
        )


class _CacheCreation(msgspec.Struct):
    ephemeral_5m_input_tokens: Any = None
    ephemeral_1h_input_tokens: Any = None


class AnthropicUsage(msgspec.Struct):
    """``usage`` of an Anthropic Messages answer; ``input_tokens`` excludes the cache."""

    input_tokens: Any = _UNSET
    output_tokens: Any = _UNSET
    cache_read_input_tokens: Any = None
    cache_creation_input_tokens: Any = None
    #: the write by cache lifetime; their sum is ``cache_creation_input_tokens``
    cache_creation: _CacheCreation | None = None

    def normalise(self) -> BackendUsage:
        by_ttl = self.cache_creation or _CacheCreation()
        problem = first_problem(
            {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
            {"cache_read_input_tokens": self.cache_read_input_tokens,
             "cache_creation_input_tokens": self.cache_creation_input_tokens,
             "ephemeral_5m_input_tokens": by_ttl.ephemeral_5m_input_tokens,
             "ephemeral_1h_input_tokens": by_ttl.ephemeral_1h_input_tokens},
            required="input_tokens")
        if problem is not None:
            return _refused(problem)
        read = _n(self.cache_read_input_tokens)
        write = self.cache_creation_input_tokens
        if write is None and self.cache_creation is not None:
            write = _n(by_ttl.ephemeral_5m_input_tokens) + _n(by_ttl.ephemeral_1h_input_tokens)
        write = _n(write)
        prompt = _n(self.input_tokens) + read + write  # three disjoint parts
        completion = _n(self.output_tokens)
        return _buckets(prompt, completion, prompt + completion, read, write, 0)


class _InputDetails(msgspec.Struct):
    cached_tokens: Any = None
    cache_write_tokens: Any = None


class _OutputDetails(msgspec.Struct):
    reasoning_tokens: Any = None


class ResponsesUsage(msgspec.Struct):
    """``usage`` of an OpenAI Responses answer; the details are parts of the totals."""

    input_tokens: Any = _UNSET
    output_tokens: Any = _UNSET
    total_tokens: Any = _UNSET
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None

    def normalise(self) -> BackendUsage:
        details = self.input_tokens_details or _InputDetails()
        out_details = self.output_tokens_details or _OutputDetails()
        problem = first_problem(
            {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
             "total_tokens": self.total_tokens},
            {"cached_tokens": details.cached_tokens,
             "cache_write_tokens": details.cache_write_tokens,
             "reasoning_tokens": out_details.reasoning_tokens},
            required="input_tokens")
        if problem is not None:
            return _refused(problem)
        return _buckets(
            _n(self.input_tokens),
            _n(self.output_tokens),
            _n(self.total_tokens),
            _n(details.cached_tokens),
            _n(details.cache_write_tokens),
            _n(out_details.reasoning_tokens),
        )


_WIRE: dict[str, type[WireUsage | AnthropicUsage | ResponsesUsage]] = {
    "openai": WireUsage,
    "anthropic": AnthropicUsage,
    "responses": ResponsesUsage,
}


def timings_cache_n(timings: Any) -> Any:
    """llama.cpp's ``timings.cache_n`` (prompt tokens read from its cache) of an answer or a
    chunk, as decoded; None when absent."""
    return timings.get("cache_n") if isinstance(timings, dict) else None


class _UsageBody(msgspec.Struct):
    usage: WireUsage | None = None
    #: llama.cpp: ``timings.cache_n`` is its cache read when the usage has no detail
    timings: Any = None


class _AnthropicBody(msgspec.Struct):
    usage: AnthropicUsage | None = None


class _ResponsesBody(msgspec.Struct):
    usage: ResponsesUsage | None = None


class _AnyBody(msgspec.Struct):
    usage: Any = None


_decode_openai = msgspec.json.Decoder(_UsageBody).decode
_decode_anthropic = msgspec.json.Decoder(_AnthropicBody).decode
_decode_responses = msgspec.json.Decoder(_ResponsesBody).decode
_decode_any_usage = msgspec.json.Decoder(_AnyBody).decode
_MALFORMED_USAGE = f"{MALFORMED}:usage"


def usage_from_body(body: bytes, shape: Shape = "openai") -> BackendUsage | None:
    """``usage`` of a non-streamed answer (chat, completion, embeddings; a Messages or a
    Responses answer with ``shape``); None when it has none (or the body is not a JSON object),
    a usage with ``rejected`` set when its figures cannot be believed."""
    wire: WireUsage | AnthropicUsage | ResponsesUsage | None
    try:
        if shape == "openai":
            answer = _decode_openai(body)
            if answer.usage is None:
                return None
            return answer.usage.normalise(timings_cache_n(answer.timings))
        if shape == "anthropic":
            wire = _decode_anthropic(body).usage
        else:
            wire = _decode_responses(body).usage
    except msgspec.ValidationError:  # JSON, not of the shape: was it the usage? (rare path)
        try:
            raw = _decode_any_usage(body).usage
        except msgspec.DecodeError:
            return None
        return None if raw is None else _refused(_MALFORMED_USAGE)
    except msgspec.DecodeError:
        return None
    return None if wire is None else wire.normalise()


def checked_usage(usage: Any, shape: Shape = "openai") -> BackendUsage:
    """A ``usage`` value already parsed (e.g. from an Anthropic ``message_start`` event or a
    Responses ``response.completed`` event), for the meter: ``rejected`` set when it cannot be
    believed (``malformed:usage`` when it is not an object of the shape)."""
    try:
        wire = msgspec.convert(usage, _WIRE[shape])
    except msgspec.ValidationError:
        return _refused(_MALFORMED_USAGE)
    return wire.normalise()


def usage_from_mapping(usage: Mapping[str, Any], shape: Shape = "openai") -> BackendUsage | None:
    """``checked_usage`` for the answer a client is shown (a translated answer's usage): None
    when the figures were read with a problem, so the translator shows none of them (its own
    count, or nothing) rather than a backend's ``1e30`` or a 0 it never reported."""
    checked = checked_usage(usage, shape)
    return None if checked.rejected is not None else checked


def malformed_usage() -> BackendUsage:
    """The usage of an answer whose ``usage`` is not a JSON object (a stream's event)."""
    return _refused(_MALFORMED_USAGE)


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    text: str | None = None


class _TextBody(msgspec.Struct):
    choices: list[_Choice] | None = None


class _Block(msgspec.Struct):
    """A Messages content block: ``text``, ``thinking`` or a ``tool_use``'s ``input``."""

    text: str | None = None
    thinking: str | None = None
    input: Any = None


class _MessagesText(msgspec.Struct):
    content: list[_Block] | None = None


class _Part(msgspec.Struct):
    text: str | None = None


class _Item(msgspec.Struct):
    """A Responses output item: a message's text parts or a function call's arguments."""

    content: list[_Part] | None = None
    arguments: str | None = None


class _ResponsesText(msgspec.Struct):
    output: list[_Item] | None = None


_decode_text = msgspec.json.Decoder(_TextBody).decode
_decode_messages_text = msgspec.json.Decoder(_MessagesText).decode
_decode_responses_text = msgspec.json.Decoder(_ResponsesText).decode
_encode_json = msgspec.json.encode


def text_from_body(body: bytes, shape: Shape = "openai") -> str:
    """Generated text of a non-streamed response (all choices; a Messages answer's text,
    thinking and tool input, a Responses answer's output text and call arguments), to count
    when its usage is absent or cannot be believed."""
    try:
        if shape == "anthropic":
            return "".join(
                b.text or b.thinking or (_encode_json(b.input).decode() if b.input else "")
                for b in _decode_messages_text(body).content or [])
        if shape == "responses":
            return "".join(
                "".join(p.text or "" for p in item.content or []) + (item.arguments or "")
                for item in _decode_responses_text(body).output or [])
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
