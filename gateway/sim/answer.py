"""What one answer will produce, decided before it runs, and the interface that renders it.

Every API (chat and text completions, Responses, Messages) parses its request into a
:class:`Plan`: the prompt's tokens (and the part read from or written to a prompt cache), then
either the exact words of a text answer or one tool call, and why the answer ends. The engine only
counts tokens; a :class:`Renderer` turns "tokens ``start..end`` are out" into the API's own bytes,
so one streaming loop (``respond.py``) serves every API.

Why an answer ends, in chat's words: ``"length"`` when the request's own token limit cut it,
``"stop"`` when a stop sequence did or when it reached the simulator's default length (a request
with no limit ends naturally there), ``"tool_calls"`` for a complete tool call.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.sim.errors import BadRequest
from gateway.sim.text import generate, request_seed
from gateway.sim.tools import make_call

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.sim.errors import SimHTTPError
    from gateway.sim.tools import ToolCall, ToolSpec

__all__ = ["Plan", "Renderer", "decide"]

_UNLIMITED = 1 << 30


@dataclass(slots=True)
class Plan:
    """One answer, decided up front."""

    #: the API's name on ``/sim/stats``: chat, completions, responses, messages
    api: str
    model: str
    #: every prompt token, cached or not
    prompt_tokens: int
    #: the text answer, one token a word (empty for a tool call)
    words: list[str]
    #: the tool call, when the answer is one
    call: ToolCall | None
    finish: str
    stream: bool
    #: the stop sequence that ended the text, if one did
    stop_sequence: str | None = None
    #: prompt tokens read from the prompt cache (the engine skips their prefill)
    cached_tokens: int = 0
    #: prompt tokens written to the prompt cache
    cache_write_tokens: int = 0
    #: the prompt as token ids, for the engine's prefix cache (None: not looked up)
    token_ids: list[int] | None = None
    #: report the engine's prefix-cache hit as ``cached_tokens`` (OpenAI's APIs); the Messages
    #: API reports only its ``cache_control`` cache, as Anthropic does
    reports_prefix_cache: bool = True
    #: the request's ``cache_salt`` (vLLM, SGLang): its prompt hits only its salt's blocks
    cache_salt: str | None = None
    #: the request's ``cache_prompt`` (llama.cpp): false looks nothing up and caches nothing
    cache_prompt: bool = True

    def read_cache_fields(self, body: dict[str, Any]) -> None:
        """Take the request's prefix-cache fields, checked as the engines check them."""
        salt = body.get("cache_salt")
        if salt is not None:
            if not isinstance(salt, str) or not salt:
                raise BadRequest("cache_salt must be a non-empty string", param="cache_salt")
            self.cache_salt = salt
        cache_prompt = body.get("cache_prompt", True)
        if not isinstance(cache_prompt, bool):
            raise BadRequest("cache_prompt must be a boolean", param="cache_prompt")
        self.cache_prompt = cache_prompt

    @property
    def output_tokens(self) -> int:
        """Tokens the engine generates for this answer."""
        return self.call.tokens if self.call is not None else len(self.words)


def decide(
    *,
    api: str,
    model: str,
    prompt_tokens: int,
    key: bytes,
    seed: int | None,
    limit: int | None,
    default_limit: int,
    stops: Sequence[str] = (),
    tool: ToolSpec | None = None,
    call_id: str = "",
    encoding: str = "o200k_base",
    stream: bool = False,
    max_len: int | None = None,
    param: str = "max_tokens",
    skip: int = 0,
    natural: bool = False,
) -> Plan:
    """The plan of an answer: text seeded by ``key`` and ``seed``, or a call to ``tool``.

    ``limit``: the request's own output limit (``None``: the answer ends naturally after
    ``default_limit`` tokens). ``max_len``: the most prompt plus output tokens the engine
    holds (``Profile.max_model_len``): a request whose prompt and limit exceed it is refused
    (400 naming ``param``, the request's limit field) before a word is generated, as vLLM
    refuses it, rather than after building an answer the engine then refuses. ``skip``: the
    answer continues one whose first ``skip`` tokens were already given (a final assistant
    message to continue): its words are those after them, and ``limit`` counts from there.
    ``natural``: a text answer whose limit is above ``default_limit`` ends by itself there.
    """
    n = default_limit if limit is None else limit
    if max_len is not None:
        _check_fits(prompt_tokens, limit if tool is not None else n, max_len, param)
    if natural and tool is None and limit is not None and limit > default_limit:
        limit = None  # it fits the context; its answer ends by itself
    if tool is not None:
        # Without a limit a call is never cut: a model ends its call, not at a default length.
        call = make_call(tool, call_id, _UNLIMITED if limit is None else limit, encoding)
        finish = "tool_calls" if call.complete else "length"
        return Plan(api, model, prompt_tokens, [], call, finish, stream)
    total = default_limit if limit is None else limit + skip
    words, matched = generate(request_seed(key, seed), total, stops)
    words = words[skip:]
    finish = "length" if matched is None and limit is not None else "stop"
    return Plan(api, model, prompt_tokens, words, None, finish, stream, stop_sequence=matched)


def _check_fits(prompt_tokens: int, output: int | None, max_len: int, param: str) -> None:
    """Refuse a prompt plus ``output`` tokens that the engine could never hold."""
    if output is None or prompt_tokens + output <= max_len:
        return
    raise BadRequest(
        f"{param}: this model's maximum context length is {max_len} tokens, and the request "
        f"asks for {prompt_tokens} prompt + {output} output tokens; reduce {param} or the "
        "prompt",
        param=param,
    )


class Renderer(abc.ABC):
    """The bytes of one answer in its API's shape; made per request, after :func:`decide`.

    A streamed answer is ``opening()``, then ``tokens(a, b)`` each time the engine has produced
    more tokens (``a`` tokens were already sent, ``b`` now exist), then ``closing(n)``, or
    ``failure(err)`` when the engine cannot go on after the headers went out.
    """

    __slots__ = ()

    @abc.abstractmethod
    def body(self, generated: int) -> bytes:
        """The whole non-streamed answer once ``generated`` tokens exist."""

    def opening(self) -> bytes:
        """The events sent as soon as the request is accepted (none by default)."""
        return b""

    @abc.abstractmethod
    def tokens(self, start: int, end: int) -> bytes:
        """The events carrying tokens ``start`` to ``end``."""

    @abc.abstractmethod
    def closing(self, generated: int) -> bytes:
        """The events that end a stream of ``generated`` tokens, usage and terminator included."""

    @abc.abstractmethod
    def failure(self, error: SimHTTPError) -> bytes:
        """The events that end a stream on an error after its headers."""
