"""The usage record: one per admitted request, the unit the ledger stores, sums and exports.

A record is written once, at the end of a request (completed, failed, cancelled or rejected
after admission), and never updated: corrections would need a second record and so a second
truth. It carries ids and names only (``key_id``, never the key) so exports can leave the
building. Its request id is the idempotency key: a record that reaches a store twice (a spool
replayed after a crash, a retried flush) counts once.

JSON is the one wire format (spool lines, ``jsonl`` export): readable by ``jq`` and by the
other replicas, and msgspec encodes it in about a microsecond.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

import msgspec

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gateway.accounting.tokens import TokenUsage
    from gateway.context import RequestContext

__all__ = [
    "Outcome",
    "UsageRecord",
    "day_of",
    "decode_record",
    "decode_records",
    "encode_lines",
    "encode_record",
    "make_record",
    "month_of",
]

#: ``interrupted``: a provisional record (written when a stream's first byte went out)
#: replayed after the process died mid-stream; its output is what was counted by then
Outcome = Literal["completed", "failed", "cancelled", "rejected", "interrupted"]

_DAY_MS = 86_400_000


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one admitted request used and cost; immutable once written.

    ``gc=False``: every field is a scalar, so a record can never be part of a reference
    cycle; untracked, the records an embedded ledger keeps cost the collector nothing.
    """

    request_id: str
    #: unix milliseconds at completion; picks the UTC day partition
    ts_ms: int
    tenant: str
    #: the tenant's team and organization when the policy places it in one
    team: str | None = None
    organization: str | None = None
    key_id: str | None = None
    #: the public model name the client asked for
    model: str = ""
    upstream_model: str | None = None
    request_class: str = ""
    pool: str | None = None
    backend: str | None = None
    #: rollout version served, when the model has versions
    version: str | None = None
    #: set only for requests of a batch job
    batch_id: str | None = None
    attempts: int = 0
    status: int = 0
    outcome: Outcome = "completed"
    system: int = 0
    history: int = 0
    new: int = 0
    tools: int = 0
    #: of ``prompt_total``: tokens read from the backend's prompt cache, and tokens written to
    #: it (disjoint; the rest is uncached input)
    cached: int = 0
    cache_write: int = 0
    #: completion tokens in all, and of them the reasoning tokens (the rest is visible output)
    output: int = 0
    reasoning: int = 0
    prompt_total: int = 0
    #: True when the tokens are the gateway's own counts, not the backend's
    estimated: bool = False
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    duration_ms: float | None = None
    #: total cost in micro-units of ``currency``; the lines below sum to it (with
    #: ``continuation_cost`` when that is billed)
    cost_micros: int = 0
    cost_system: int = 0
    cost_history: int = 0
    cost_new: int = 0
    cost_tools: int = 0
    #: visible output and reasoning; with the four input lines they sum to ``cost_micros``
    cost_output: int = 0
    cost_reasoning: int = 0
    #: of the input lines, what was charged at the cache-read and cache-write rates
    cost_cached: int = 0
    cost_cache_write: int = 0
    currency: str = "USD"
    #: the client API the request came in: chat, completions, embeddings, responses, messages
    api: str = "chat"
    #: why the tokens are estimated (``estimated``), in the gateway's own words: ``no_usage``
    #: (the backend reported none), ``<kind>:<field>`` for usage it did not believe (e.g.
    #: ``too_large:prompt_tokens``, ``null:completion_tokens``; ``accounting.usage_bounds``),
    #: ``clamped:<field>`` for a number the ledger had to fit into its column; None otherwise
    estimate_reason: str | None = None
    #: whether the whole answer reached the client's connection: True once its last bytes
    #: were handed over without an error; False for an answer cut (a client gone, a stall, a
    #: deadline, a backend failing mid-stream) or withheld (``usage_not_recorded``); None for
    #: records written before this field, and provisional (``interrupted``) ones
    delivered: bool | None = None
    #: output tokens of the answer handed to the client (of ``output``)
    sent_output: int = 0
    #: a stream broken after its first byte that went on on another backend
    #: (``pools[].continuation``); its ``output`` is still what the client received
    continued: bool = False
    #: the continuations' prompt tokens (the prompt plus the text already sent): what
    #: ``continuation_cost`` prices
    continuation_prompt: int = 0
    #: ``continuation_prompt`` at the uncached input price, in micro-units of ``currency``:
    #: the operator's cost of continuing; also in ``cost_micros`` (billed to the tenant) only
    #: when the stream's ``continuation.billed`` is on
    continuation_cost: int = 0

    @property
    def day(self) -> str:
        """The UTC day partition, ``YYYY-MM-DD``."""
        return day_of(self.ts_ms)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(UsageRecord)


def encode_lines(records: Iterable[UsageRecord]) -> bytes:
    """Records as JSON Lines (newline after each), encoded in one call."""
    return _encoder.encode_lines(records)


def encode_record(record: UsageRecord) -> bytes:
    """One record as compact JSON (no newline)."""
    return _encoder.encode(record)


def decode_record(data: bytes | str) -> UsageRecord:
    """The inverse of ``encode_record``; raises ``msgspec.ValidationError`` on bad input."""
    return _decoder.decode(data)


def decode_records(lines: bytes) -> tuple[list[UsageRecord], int]:
    """Records of a JSONL blob and the number of lines that did not decode.

    A torn last line (a crash mid-write, before its fsync) is counted, not raised: it was
    never reported durable, and one bad line must not keep the rest of a spool from the database.
    """
    records: list[UsageRecord] = []
    bad = 0
    for line in lines.splitlines():
        if not line.strip():
            continue
        try:
            records.append(_decoder.decode(line))
        except msgspec.DecodeError:
            bad += 1
    return records, bad


@lru_cache(maxsize=64)
def _day_label(day_number: int) -> str:
    return datetime.fromtimestamp(day_number * 86_400, UTC).strftime("%Y-%m-%d")


def day_of(ts_ms: int) -> str:
    """UTC day of a unix-ms timestamp; cached per day, so cheap on the hot path."""
    return _day_label(ts_ms // _DAY_MS)


def month_of(ts_ms: int) -> str:
    """UTC month of a unix-ms timestamp, ``YYYY-MM``."""
    return day_of(ts_ms)[:7]


def make_record(
    context: RequestContext,
    usage: TokenUsage | None,
    *,
    tenant: str,
    team: str | None = None,
    organization: str | None = None,
    batch_id: str | None = None,
    currency: str = "USD",
    ts_ms: int | None = None,
    api: str = "chat",
) -> UsageRecord:
    """The record of a finished request, from its context and its accounted usage.

    ``usage`` is None when nothing was counted (rejected before the prompt was read): the
    record still exists, with zero tokens, so every admitted request leaves exactly one.
    """
    cost = usage.cost if usage is not None else None
    ttft, duration = context.ttft_ms, context.duration_ms
    tpot = None
    if usage is not None and ttft is not None and duration is not None and usage.output > 1:
        tpot = (duration - ttft) / (usage.output - 1)
    outcome: Outcome = "completed"
    if context.outcome in ("failed", "cancelled", "rejected"):
        outcome = context.outcome  # type: ignore[assignment]
    u = usage
    # every field written out: keywords in one call cost 2.9 us a record, where a mapping of
    # names (``**fields``) cost 4.8; tests/ledger/test_record.py checks no field is missed
    return UsageRecord(
        request_id=context.request_id,
        ts_ms=ts_ms if ts_ms is not None else time.time_ns() // 1_000_000,
        tenant=tenant,
        team=team,
        organization=organization,
        key_id=context.key_id,
        model=context.request_model or "",
        upstream_model=context.upstream_model,
        request_class=context.request_class or "",
        pool=context.pool,
        backend=context.backend,
        version=context.version,
        batch_id=batch_id,
        attempts=context.attempts,
        status=context.status,
        outcome=outcome,
        system=u.system if u else 0,
        history=u.history if u else 0,
        new=u.new if u else 0,
        tools=u.tools if u else 0,
        cached=u.cached if u else 0,
        cache_write=u.cache_write if u else 0,
        output=u.output if u else 0,
        reasoning=u.reasoning if u else 0,
        prompt_total=u.prompt_total if u else 0,
        estimated=u.estimated if u else False,
        ttft_ms=ttft,
        tpot_ms=tpot,
        duration_ms=duration,
        cost_micros=cost.total if cost else 0,
        cost_system=cost.system if cost else 0,
        cost_history=cost.history if cost else 0,
        cost_new=cost.new if cost else 0,
        cost_tools=cost.tools if cost else 0,
        cost_output=cost.output if cost else 0,
        cost_reasoning=cost.reasoning if cost else 0,
        cost_cached=cost.cached if cost else 0,
        cost_cache_write=cost.cache_write if cost else 0,
        currency=currency,
        api=api,
        estimate_reason=u.estimate_reason if u else None,
        delivered=context.delivered,
        sent_output=(u.output if u else 0) if context.delivered or context.stream else 0,
        continued=context.continued,
        continuation_prompt=context.continuation_prompt,
        continuation_cost=cost.continuation if cost else 0,
    )
