"""Chat and text completions: parse the request into a plan, and render its answer.

Parsing decides everything up front (prompt tokens, the exact words or the tool call, the finish
reason), so the engine only counts tokens and the renderer only slices the plan. A chat request
that offers function tools is answered with a tool call by the rule of ``tools.py`` (unless its
``tool_choice`` is "none" or its last message is a ``tool`` result).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.sim.answer import Renderer, decide
from gateway.sim.errors import BadRequest
from gateway.sim.prompt import prompt_ids, prompt_key
from gateway.sim.shapes import DONE, ChunkFormat, completion_body, new_id, tool_call, usage
from gateway.sim.tools import ToolSpec, pick_tool
from gateway.tokenizers import get_encoding

if TYPE_CHECKING:
    from gateway.sim.answer import Plan
    from gateway.sim.config import SimConfig
    from gateway.sim.errors import SimHTTPError

__all__ = ["CompletionRenderer", "parse_completion"]

_encode = msgspec.json.Encoder().encode


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"{key} must be a positive integer", param=key)
        return value
    return None


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise BadRequest("stop must be a string or a list of strings", param="stop")


def _prompt(body: dict[str, Any], chat: bool, encoding: str) -> tuple[list[int], bytes]:
    """The prompt's token ids (several prompts: one after the other) and the bytes that seed
    the generated text."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a list of message objects", param="messages")
        return prompt_ids(messages, encoding), prompt_key(messages)
    prompt = body.get("prompt")
    encode = get_encoding(encoding).encode_ordinary
    if isinstance(prompt, str):
        return encode(prompt), prompt.encode()
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [t for p in prompt for t in encode(p)], _encode(prompt)
        if all(isinstance(p, int) for p in prompt):
            return list(prompt), _encode(prompt)
        if all(isinstance(p, list) for p in prompt):
            return [t for p in prompt for t in p], _encode(prompt)
    raise BadRequest("prompt must be a string, a list of strings or token arrays", param="prompt")


def _continued(body: dict[str, Any]) -> str | None:
    """The assistant text a chat request asks to continue (vLLM's ``continue_final_message``,
    or ``add_generation_prompt: false``, with a final assistant message), else None."""
    if body.get("continue_final_message") is not True and \
            body.get("add_generation_prompt") is not False:
        return None
    last = body["messages"][-1] if body["messages"] else None
    if last is None or last.get("role") != "assistant" or \
            not isinstance(last.get("content"), str):
        return None
    return str(last["content"])


def _tools(body: dict[str, Any]) -> list[ToolSpec]:
    """The function tools a chat request offers (other tool types are never called)."""
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list of tool objects", param="tools")
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequest(f"tools[{i}] must be an object", param=f"tools[{i}]")
        if tool.get("type", "function") != "function":
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest(
                f"tools[{i}].function.name must be a non-empty string",
                param=f"tools[{i}].function.name",
            )
        assert isinstance(function, dict)
        parameters = function.get("parameters")
        parameters = {} if parameters is None else parameters
        if not isinstance(parameters, dict):
            raise BadRequest(
                f"tools[{i}].function.parameters must be an object",
                param=f"tools[{i}].function.parameters",
            )
        specs.append(ToolSpec(name, parameters))
    return specs


def _choice(body: dict[str, Any]) -> tuple[str | None, bool]:
    """(the tool ``tool_choice`` forces, whether it is "none")."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "required"):
        return None, False
    if choice == "none":
        return None, True
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") == "function" and isinstance(name, str):
            return name, False
        if choice.get("type") == "allowed_tools":
            return None, False
    raise BadRequest(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
        "'function': {'name': ...}}",
        param="tool_choice",
    )


def parse_completion(
    body: dict[str, Any], *, chat: bool, model: str, cfg: SimConfig
) -> tuple[Plan, CompletionRenderer]:
    """Validate a chat or text completion request and decide its answer."""
    token_ids, key = _prompt(body, chat, cfg.encoding)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed must be an integer", param="seed")
    tool = None
    skip = 0
    if chat and (prefix := _continued(body)) is not None:
        # the text the answer continues: the same words as the answer to the conversation
        # without it (its seed), from the first word after it (one token a word)
        key = prompt_key(body["messages"][:-1])
        skip = len(get_encoding(cfg.encoding).encode_ordinary(prefix))
    elif chat:
        messages = body["messages"]
        forced, none = _choice(body)
        last_role = messages[-1].get("role") if messages else None
        tool = pick_tool(
            _tools(body),
            forced,
            none=none,
            after_result=last_role in ("tool", "function"),
            param="tool_choice",
        )
    plan = decide(
        api="chat" if chat else "completions",
        model=model,
        prompt_tokens=len(token_ids),
        key=key,
        seed=seed,
        limit=_max_tokens(body),
        default_limit=cfg.default_max_tokens,
        natural=cfg.natural_length,
        stops=_stop(body),
        tool=tool,
        call_id=new_id("call", "_"),
        encoding=cfg.encoding,
        stream=bool(body.get("stream")),
        max_len=cfg.profile.max_model_len,
        param="max_completion_tokens" if body.get("max_completion_tokens") is not None
        else "max_tokens",
        skip=skip,
    )
    plan.token_ids = token_ids
    plan.read_cache_fields(body)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return plan, CompletionRenderer(plan, chat=chat, include_usage=include_usage)


class CompletionRenderer(Renderer):
    """A chat completion or a text completion, whole or as OpenAI's SSE chunks."""

    __slots__ = ("chat", "fmt", "include_usage", "plan")

    def __init__(self, plan: Plan, *, chat: bool, include_usage: bool) -> None:
        self.plan = plan
        self.chat = chat
        self.include_usage = include_usage
        self.fmt = ChunkFormat(chat=chat, model=plan.model) if plan.stream else None

    def _usage(self, generated: int) -> dict[str, Any]:
        return usage(self.plan.prompt_tokens, generated, self.plan.cached_tokens)

    def _stop_reason(self, generated: int) -> str | None:
        """The stop string that ended the text (vLLM's ``stop_reason``), once it is whole."""
        p = self.plan
        return p.stop_sequence if generated >= len(p.words) else None

    def body(self, generated: int) -> bytes:
        p = self.plan
        calls = None
        if p.call is not None:
            calls = [tool_call(p.call.call_id, p.call.name, p.call.sent_arguments)]
        return completion_body(
            chat=self.chat,
            model=p.model,
            text="".join(p.words[:generated]),
            finish_reason=p.finish,
            usage_=self._usage(generated),
            tool_calls=calls,
            stop_reason=self._stop_reason(generated),
        )

    def tokens(self, start: int, end: int) -> bytes:
        fmt = self.fmt
        assert fmt is not None
        call = self.plan.call
        if call is None:
            words = self.plan.words
            # Hot path: one token per wake-up unless this consumer fell behind.
            if end == start + 1 and start:
                return fmt.token(words[start])
            events = [fmt.token(w) for w in words[start:end]]
            if start == 0:
                events.insert(0, fmt.role())
            return b"".join(events)
        # A tool call: its first event once the name's tokens are out, then one per fragment.
        named = call.name_tokens
        out = [fmt.tool_head(call.call_id, call.name)] if start < named <= end else []
        pieces = call.pieces[max(start - named, 0) : max(end - named, 0)]
        out.extend(fmt.tool_arguments(piece) for piece in pieces)
        return b"".join(out)

    def closing(self, generated: int) -> bytes:
        fmt = self.fmt
        assert fmt is not None
        tail = fmt.finish(self.plan.finish, self._stop_reason(generated))
        if self.include_usage:
            tail += fmt.usage(self._usage(generated))
        return tail + DONE

    def failure(self, error: SimHTTPError) -> bytes:
        fmt = self.fmt
        assert fmt is not None
        return fmt.error(error.message, error.type, error.code) + DONE
