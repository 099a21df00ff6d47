"""What a stored response gives back: the conversation to re-send, and its input items.

A request naming ``previous_response_id`` continues a stored conversation: the pipeline loads
it and passes ``conversation(...)`` to ``translate`` as ``earlier``, so the backend sees the
whole conversation and the history split counts those turns as history. A stored response
holds the messages its own turn added (``turn_messages``: its input, then its answer's
assistant turn, its ``function_call`` and ``custom_tool_call`` items as the chat tool calls
they were made from, so a later ``function_call_output`` / ``custom_tool_call_output`` answers
them) and points at the response it continued, so the conversation is its chain's
turns, oldest first; a row stored before chains holds its whole conversation
(``earlier_messages``) and starts it. The earlier request's ``instructions`` are not carried
over (OpenAI documents that a new response's instructions replace them), but system and
developer messages the client sent as input are part of the conversation and are. Reasoning
is not re-sent either: chat backends that produce it (DeepSeek) refuse it on input.

``input_items`` is ``GET /v1/responses/{id}/input_items``: the items the client sent in that
request (not the history it continued), each with an id, in the API's list shape and cursor
paging (``order``, ``after``, ``before``, ``limit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.dialects.responses.answer import chat_answer_from_response, text_part
from gateway.errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gateway.ledger.sql.stored_responses import StoredResponse

__all__ = ["MAX_LIMIT", "conversation", "earlier_messages", "input_items", "reply_message",
           "turn_messages"]

#: the largest page ``input_items`` serves (the API's bound; 20 by default)
MAX_LIMIT = 100
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
           "custom_tool_call": "ctc", "custom_tool_call_output": "ctco", "reasoning": "rs"}


def reply_message(answer: Mapping[str, Any]) -> dict[str, Any]:
    """``answer``'s assistant turn (text and tool calls, no reasoning) as a chat message."""
    reply: dict[str, Any] = chat_answer_from_response(answer)["choices"][0]["message"]
    reply.pop("reasoning_content", None)
    return reply


def turn_messages(own: Sequence[Mapping[str, Any]], answer: Mapping[str, Any]
                  ) -> list[dict[str, Any]]:
    """What one turn adds to its conversation, as stored: ``own`` (the chat messages of the
    request's own input, not its instructions nor the turns it continued), then its answer's
    assistant turn."""
    return [*(dict(m) for m in own), reply_message(answer)]


def earlier_messages(messages: Sequence[Mapping[str, Any]], answer: Mapping[str, Any]
                     ) -> list[dict[str, Any]]:
    """The chat messages a later request continuing ``answer`` re-sends, for a row that holds
    its whole conversation (stored before chains): ``messages`` (the stored request's chat
    messages) without the system message its ``instructions`` made, then the answer's
    assistant turn (text and tool calls) in chat form."""
    kept = [dict(m) for m in messages]
    instructions = answer.get("instructions")
    if (isinstance(instructions, str) and kept
            and kept[0] == {"role": "system", "content": instructions}):
        del kept[0]
    return [*kept, reply_message(answer)]


def conversation(chain: Sequence[StoredResponse]) -> list[dict[str, Any]]:
    """The chat messages a request continuing ``chain``'s last response re-sends (``chain``:
    its responses, oldest first, as ``ResponseStore.chain`` reads them)."""
    messages: list[dict[str, Any]] = []
    for row in chain:
        if row.delta:
            messages.extend(row.messages)
        else:  # a whole conversation (the walk ends there, so it is the first)
            messages = earlier_messages(row.messages, row.answer)
    return messages


def input_items(
    payload: Mapping[str, Any],
    *,
    response_id: str,
    order: str = "desc",
    after: str | None = None,
    before: str | None = None,
    limit: int = 20,
) -> dict[str, Any]:
    """One page of a stored request's input items (``payload``: the request as the client sent
    it, already checked by ``translate``)."""
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be one of asc, desc", param="order")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}", param="limit")
    items = _items(payload.get("input"), response_id.removeprefix("resp_"))
    if order == "desc":
        items.reverse()
    ids = [item["id"] for item in items]
    start, end = 0, len(items)
    for name, cursor in (("after", after), ("before", before)):
        if cursor is None:
            continue
        if cursor not in ids:
            raise InvalidRequest(f"'{name}' is not an input item of this response", param=name)
        if name == "after":
            start = ids.index(cursor) + 1
        else:
            end = ids.index(cursor)
    window = items[start:end]
    page = window[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(window) > limit,
    }


def _items(value: Any, rid: str) -> list[dict[str, Any]]:
    """The request's input as items with ids and statuses, in the order sent."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    items: list[dict[str, Any]] = []
    for i, item in enumerate(value if isinstance(value, list) else ()):
        kind = item.get("type") or "message"
        out = {**item, "id": item.get("id") or f"{_PREFIX.get(kind, 'item')}_{rid}_in{i}",
               "type": kind}
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                assistant = item.get("role") == "assistant"
                out["content"] = [text_part(content) if assistant
                                  else {"type": "input_text", "text": content}]
        if kind != "reasoning":
            out["status"] = "completed"
        items.append(out)
    return items
