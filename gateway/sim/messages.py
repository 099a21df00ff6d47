"""``POST /v1/messages`` (and ``/v1/messages/count_tokens``): Anthropic's Messages API, natively.

``system`` (a string or text blocks) and ``messages`` (a string or content blocks: ``text``,
``image``, ``document``, ``tool_use``, ``tool_result``, ``thinking``) are written as chat messages
to count the prompt and seed the text (``prompt.py``): the system text first, with the text of
the ``system``-role messages of ``messages`` folded into it in their order (Claude Code sends
them); per turn its text, an assistant's ``tool_use`` blocks as tool calls, a user's
``tool_result`` blocks as ``tool`` messages before the rest of the turn. ``max_tokens`` is
required, as upstream. With client ``tools`` (server and Anthropic-defined tools are accepted and
never called), a ``tool_choice`` other than ``none`` and a last turn holding no ``tool_result``,
the answer is one ``tool_use`` block (``tools.py``); else a ``text`` block, ending ``max_tokens``
(the limit is always the client's) or ``stop_sequence`` (with the sequence matched). Fields the
simulator has no use for (``thinking``, ``context_management``, ``output_config``, ...) are
accepted and ignored.

Blocks that carry ``cache_control`` are cache breakpoints (``cache.py``): the usage splits the
prompt into ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and the rest,
``input_tokens``. A breakpoint's prefix is counted as the chat messages of the request cut after
that block, without the reply priming; tool definitions count nothing, so a breakpoint on a tool
caches 0 tokens. Streams follow Anthropic's event sequence (``message_start`` with the input
usage, ``content_block_start``, ``ping``, deltas, ``content_block_stop``, ``message_delta`` with
the stop reason and the cumulative usage, ``message_stop``); errors have Anthropic's shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.sim.answer import Renderer, decide
from gateway.sim.cache import PrefixHasher
from gateway.sim.errors import BadRequest, anthropic_error_body, anthropic_status_type
from gateway.sim.prompt import count_prompt, prompt_ids, prompt_key
from gateway.sim.shapes import named_event, new_id
from gateway.sim.tools import ToolSpec, pick_tool
from gateway.tokenizers import REPLY_PRIMING

if TYPE_CHECKING:
    from gateway.sim.answer import Plan
    from gateway.sim.cache import PromptCache
    from gateway.sim.config import SimConfig
    from gateway.sim.errors import SimHTTPError

__all__ = ["MessagesRenderer", "MessagesRequest", "count_tokens_body", "parse_message"]

_encode = msgspec.json.Encoder().encode
_canonical = msgspec.json.Encoder(order="deterministic").encode
_SILENT_BLOCKS = frozenset({"image", "document", "thinking", "redacted_thinking", "search_result"})
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
_PING = named_event(b"ping", b'{"type":"ping"}')


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's or the system's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: Input should be a string or a list of content blocks")
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise BadRequest(f"{where}.{i}.type: Field required")
    return content


def _text_of(blocks: list[dict[str, Any]], where: str) -> str:
    texts: list[str] = []
    for i, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"{where}.{i}.text: Input should be a valid string")
            texts.append(text)
        elif kind not in _SILENT_BLOCKS:
            raise BadRequest(f"{where}.{i}: a {kind} block is not allowed here")
    return "".join(texts)


def _turn(role: str, blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = block["type"]
        at = f"{where}.{i}"
        if kind == "tool_use" and role == "assistant":
            name, call_id, arguments = block.get("name"), block.get("id"), block.get("input")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise BadRequest(f"{at}: tool_use needs a string id and name")
            if not isinstance(arguments, dict):
                raise BadRequest(f"{at}.input: Input should be a valid dictionary")
            function = {"name": name, "arguments": _encode(arguments).decode()}
            calls.append({"id": call_id, "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"{at}.tool_use_id: Field required")
            result = block.get("content")
            text = "" if result is None else _text_of(_blocks(result, at + ".content"), at)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            rest.append(block)
    if rest or calls or not out:
        message: dict[str, Any] = {"role": role, "content": _text_of(rest, where)}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


@dataclass(slots=True)
class MessagesRequest:
    """A Messages request, checked."""

    system: list[dict[str, Any]]
    turns: list[tuple[str, list[dict[str, Any]]]]
    tools: list[dict[str, Any]]

    def chat(
        self, system_blocks: int | None = None, upto: tuple[int, int] | None = None
    ) -> list[dict[str, Any]]:
        """The request as chat messages; cut after system block ``system_blocks`` (no turns)
        or after block ``upto = (turn, block)``."""
        system = self.system if system_blocks is None else self.system[: system_blocks + 1]
        out: list[dict[str, Any]] = []
        text = _text_of(system, "system")
        if text or system:
            out.append({"role": "system", "content": text})
        if system_blocks is not None:
            return out
        for j, (role, blocks) in enumerate(self.turns):
            if upto is not None and j == upto[0]:
                out.extend(_turn(role, blocks[: upto[1] + 1], f"messages.{j}.content"))
                break
            out.extend(_turn(role, blocks, f"messages.{j}.content"))
        return out

    @property
    def after_result(self) -> bool:
        """Whether the last turn carries a tool result."""
        role, blocks = self.turns[-1]
        return role == "user" and any(b["type"] == "tool_result" for b in blocks)


def _read(body: dict[str, Any]) -> MessagesRequest:
    if not isinstance(body.get("model"), str):
        raise BadRequest("model: Field required", param="model")
    raw_system = body.get("system")
    system = [] if raw_system is None else _blocks(raw_system, "system")
    _text_of(system, "system")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: Input should be a non-empty list", param="messages")
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for j, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant", "system"):
            raise BadRequest(
                f"messages.{j}.role: Input should be 'user', 'assistant' or 'system'"
            )
        assert isinstance(message, dict)
        blocks = _blocks(message.get("content"), f"messages.{j}.content")
        if role == "system":  # folded into the system prompt, in order
            _text_of(blocks, f"messages.{j}.content")
            system = [*system, *blocks]
        else:
            turns.append((role, blocks))
    if not turns:
        raise BadRequest("messages: at least one user or assistant message is required")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("tools: Input should be a valid list", param="tools")
    client: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools.{i}.name: Field required")
        if tool.get("type") not in (None, "custom"):
            continue  # a server or Anthropic-defined tool: never called here
        if not isinstance(tool.get("input_schema"), dict):
            raise BadRequest(f"tools.{i}.input_schema: Field required")
        client.append(tool)
    return MessagesRequest(system, turns, client)


def _choice(raw: Any) -> tuple[str | None, bool]:
    """(the tool ``tool_choice`` forces, whether it is "none")."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if raw is None or kind in ("auto", "any"):
        return None, False
    if kind == "none":
        return None, True
    if kind == "tool" and isinstance(raw.get("name"), str):
        return raw["name"], False
    raise BadRequest("tool_choice: Input should be auto, any, tool (with a name) or none")


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens")
    if value is None:
        raise BadRequest("max_tokens: Field required", param="max_tokens")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest("max_tokens: Input should be a positive integer", param="max_tokens")
    return value


def _stops(body: dict[str, Any]) -> list[str]:
    stops = body.get("stop_sequences")
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("stop_sequences: Input should be a list of strings")
    return stops


def _blocks_in_order(request: MessagesRequest) -> list[tuple[str, Any, dict[str, Any]]]:
    """Every block in prompt order, tools first: ``(section, position, block)``."""
    out: list[tuple[str, Any, dict[str, Any]]] = [
        ("tools", i, tool) for i, tool in enumerate(request.tools)
    ]
    out.extend(("system", i, block) for i, block in enumerate(request.system))
    for j, (role, blocks) in enumerate(request.turns):
        out.extend((role, [j, k], block) for k, block in enumerate(blocks))
    return out


def _digests(elements: list[tuple[str, Any, dict[str, Any]]], model: str, last: int) -> list[bytes]:
    """The hash of every prefix of the first ``last + 1`` blocks (``cache_control`` left out)."""
    hasher = PrefixHasher(model.encode())
    for section, where, block in elements[: last + 1]:
        bare = {k: v for k, v in block.items() if k != "cache_control"}
        hasher.add(_canonical([section, where, bare]))
    return hasher.digests


def _prefix_tokens(
    request: MessagesRequest, cut: tuple[str, Any], total: int, encoding: str
) -> int:
    """Tokens of the prompt up to and including the block at ``cut``, without reply priming."""
    section, where = cut
    if section == "tools":
        return 0
    if section == "system":
        messages = request.chat(system_blocks=where)
    else:
        messages = request.chat(upto=(where[0], where[1]))
    return max(0, min(total, count_prompt(messages, encoding) - REPLY_PRIMING))


def _cache(
    request: MessagesRequest, model: str, total: int, encoding: str, cache: PromptCache
) -> tuple[int, int]:
    """(tokens read from the prompt cache, tokens written to it) for this request."""
    elements = _blocks_in_order(request)
    marks = [i for i, (_, _, block) in enumerate(elements) if block.get("cache_control")]
    if not marks:
        return 0, 0
    last = marks[-1]
    digests = _digests(elements, model, last)
    hit = cache.longest(digests, last)

    def tokens(i: int) -> int:
        section, where, _ = elements[i]
        return _prefix_tokens(request, (section, where), total, encoding)

    read = tokens(hit) if hit >= 0 else 0
    written = tokens(last) if last > hit else read
    cache.write(digests[m] for m in marks)
    return read, max(0, written - read)


def count_tokens_body(body: dict[str, Any], *, cfg: SimConfig) -> bytes:
    """The answer to ``POST /v1/messages/count_tokens``: the prompt's ``input_tokens``."""
    request = _read(body)
    return _encode({"input_tokens": count_prompt(request.chat(), cfg.encoding)})


def parse_message(
    body: dict[str, Any], *, model: str, cfg: SimConfig, cache: PromptCache
) -> tuple[Plan, MessagesRenderer]:
    """Validate a Messages request, settle its cache figures and decide its answer."""
    request = _read(body)
    limit = _max_tokens(body)
    stops = _stops(body)
    forced, none = _choice(body.get("tool_choice"))
    # a deferred tool (``defer_loading``: tool search) is not in the model's context: never
    # the one called
    specs = [ToolSpec(t["name"], t["input_schema"]) for t in request.tools
             if t.get("defer_loading") is not True]
    tool = pick_tool(
        specs, forced, none=none, after_result=request.after_result, param="tool_choice"
    )
    messages = request.chat()
    token_ids = prompt_ids(messages, cfg.encoding)
    total = len(token_ids)
    plan = decide(
        api="messages",
        model=model,
        prompt_tokens=total,
        key=prompt_key(messages),
        seed=None,
        limit=limit,
        default_limit=cfg.default_max_tokens,
        natural=cfg.natural_length,
        stops=stops,
        tool=tool,
        call_id=new_id("toolu", "_"),
        encoding=cfg.encoding,
        stream=bool(body.get("stream")),
        max_len=cfg.profile.max_model_len,
    )
    plan.token_ids = token_ids
    plan.read_cache_fields(body)
    # the cache_control cache is kept per salt too: a salted prompt reads only its salt's
    # entries (the model name and the salt together key them)
    scope = model if plan.cache_salt is None else f"{model}\0{plan.cache_salt}"
    plan.cached_tokens, plan.cache_write_tokens = _cache(request, scope, total, cfg.encoding, cache)
    plan.reports_prefix_cache = False
    return plan, MessagesRenderer(plan)


class MessagesRenderer(Renderer):
    """A ``message`` object, whole or as Anthropic's stream events."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.id = new_id("msg", "_")
        self._started = False
        self._text_head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"text_delta","text":'
        )
        self._json_head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"input_json_delta","partial_json":'
        )

    @property
    def _stop_reason(self) -> str:
        p = self.plan
        if p.stop_sequence is not None:
            return "stop_sequence"
        return _STOP_REASONS.get(p.finish, "end_turn")

    def _usage(self, generated: int) -> dict[str, Any]:
        p = self.plan
        written = p.cache_write_tokens
        return {
            "input_tokens": p.prompt_tokens - p.cached_tokens - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": p.cached_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": written,
                "ephemeral_1h_input_tokens": 0,
            },
            "output_tokens": generated,
            "service_tier": "standard",
        }

    def _block(self, generated: int, *, empty: bool = False) -> dict[str, Any]:
        call = self.plan.call
        if call is None:
            return {"type": "text", "text": "" if empty else "".join(self.plan.words[:generated])}
        arguments: Any = {}
        if not empty and call.complete:
            arguments = json.loads(call.arguments)
        return {"type": "tool_use", "id": call.call_id, "name": call.name, "input": arguments}

    def _message(self, generated: int | None) -> dict[str, Any]:
        done = generated is not None
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.plan.model,
            "content": [self._block(generated)] if done else [],  # type: ignore[arg-type]
            "stop_reason": self._stop_reason if done else None,
            "stop_sequence": self.plan.stop_sequence if done else None,
            "usage": self._usage(generated or 0),
        }

    def body(self, generated: int) -> bytes:
        return _encode(self._message(generated))

    @staticmethod
    def _event(payload: dict[str, Any]) -> bytes:
        return named_event(payload["type"].encode(), _encode(payload))

    def opening(self) -> bytes:
        return self._event({"type": "message_start", "message": self._message(None)})

    def _start_block(self) -> bytes:
        self._started = True
        block = self._block(0, empty=True)
        start = {"type": "content_block_start", "index": 0, "content_block": block}
        return self._event(start) + _PING

    def tokens(self, start: int, end: int) -> bytes:
        call = self.plan.call
        out: list[bytes] = []
        if call is None:
            if not self._started:
                out.append(self._start_block())
            head = self._text_head
            out.extend(head + _encode(w) + b"}}\n\n" for w in self.plan.words[start:end])
            return b"".join(out)
        named = call.name_tokens
        if start < named <= end:
            out.append(self._start_block())
        head = self._json_head
        pieces = call.pieces[max(start - named, 0) : max(end - named, 0)]
        out.extend(head + _encode(piece) + b"}}\n\n" for piece in pieces)
        return b"".join(out)

    def closing(self, generated: int) -> bytes:
        out = [] if self._started else [self._start_block()]
        out.append(self._event({"type": "content_block_stop", "index": 0}))
        usage = self._usage(generated)
        del usage["cache_creation"], usage["service_tier"]
        delta = {"stop_reason": self._stop_reason, "stop_sequence": self.plan.stop_sequence}
        out.append(self._event({"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(self._event({"type": "message_stop"}))
        return b"".join(out)

    def failure(self, error: SimHTTPError) -> bytes:
        body = anthropic_error_body(error.message, anthropic_status_type(error.anthropic_status))
        return named_event(b"error", body)
