"""The record: encoding, day partitions, building one from a request's context."""

from __future__ import annotations

import msgspec
import pytest

import gateway.ledger as ledger_pkg
from gateway.accounting.prices import CostBreakdown
from gateway.accounting.tokens import TokenUsage
from gateway.context import RequestContext
from gateway.ledger import UsageRecord, day_of, decode_record, encode_record, make_record, month_of


def test_exported_names_match_all() -> None:
    public = {n for n in dir(ledger_pkg) if not n.startswith("_")} - {"annotations"}
    modules = {
        "aggregate", "backoff", "base", "errors", "export", "health", "journal", "record", "spool",
        "sql", "window",
    }  # fmt: skip
    assert public - modules == set(ledger_pkg.__all__)


def test_json_round_trip() -> None:
    record = UsageRecord(request_id="r1", ts_ms=1_700_000_000_000, tenant="t", ttft_ms=1.5)
    assert decode_record(encode_record(record)) == record
    with pytest.raises(msgspec.DecodeError):
        decode_record(b'{"request_id": 1}')


@pytest.mark.parametrize(
    ("ts_ms", "day"),
    [
        pytest.param(0, "1970-01-01", id="epoch"),
        pytest.param(1_709_251_199_999, "2024-02-29", id="last-ms-of-leap-day"),
        pytest.param(1_709_251_200_000, "2024-03-01", id="first-ms-of-march"),
    ],
)
def test_day_partition_is_utc(ts_ms: int, day: str) -> None:
    assert day_of(ts_ms) == day
    assert month_of(ts_ms) == day[:7]


def test_make_record_from_context_and_usage() -> None:
    """Ids, names, timings and cost lines come from the context and the accounted usage."""
    ctx = RequestContext(request_id="req-9", endpoint="/v1/chat/completions", started_ns=0)
    ctx.key_id, ctx.request_model, ctx.upstream_model = "k1", "chat", "llama"
    ctx.request_class, ctx.pool, ctx.backend, ctx.attempts = "interactive", "p", "b", 2
    ctx.status, ctx.outcome = 200, "completed"
    ctx.first_token_ns, ctx.finished_ns = 100_000_000, 1_100_000_000
    cost = CostBreakdown(system=1, history=2, new=3, tools=0, output=10, total=16)
    usage = TokenUsage(system=5, history=6, new=7, output=11, prompt_total=18, cost=cost)
    r = make_record(ctx, usage, tenant="acme", ts_ms=42)
    assert (r.request_id, r.tenant, r.key_id, r.model, r.upstream_model) == (
        "req-9", "acme", "k1", "chat", "llama",
    )  # fmt: skip
    assert (r.system, r.history, r.new, r.output, r.prompt_total) == (5, 6, 7, 11, 18)
    assert (r.cost_micros, r.cost_output, r.attempts, r.status) == (16, 10, 2, 200)
    assert r.ttft_ms == 100.0 and r.duration_ms == 1100.0 and r.tpot_ms == 100.0


def test_make_record_without_usage() -> None:
    """A request rejected before it was counted still gets its (zero) record."""
    ctx = RequestContext(request_id="req-0", endpoint="/v1/completions")
    ctx.outcome, ctx.status = "rejected", 429
    r = make_record(ctx, None, tenant="acme")
    assert (r.outcome, r.status, r.prompt_total, r.cost_micros) == ("rejected", 429, 0, 0)


#: the record fields of the cost lines not named ``cost_<line>``
_COST_FIELDS = {"total": "cost_micros", "continuation": "continuation_cost"}


def test_make_record_copies_every_token_and_cost_field_by_name() -> None:
    """Each record field named like a ``TokenUsage`` field is copied from it, and each
    ``cost_<x>`` from the ``CostBreakdown``'s ``<x>`` (``cost_micros`` from its total,
    ``continuation_cost`` from its ``continuation``): a distinct value in every source field
    must arrive in its field."""
    record_fields = set(UsageRecord.__struct_fields__)
    numeric = [f for f in TokenUsage.__struct_fields__
               if f in record_fields and isinstance(getattr(TokenUsage(), f), int)
               and not isinstance(getattr(TokenUsage(), f), bool)]
    usage_values = {name: 100 + i for i, name in enumerate(numeric)}
    cost_names = list(CostBreakdown.__struct_fields__)
    costs = CostBreakdown(**{name: 1000 + i for i, name in enumerate(cost_names)})
    usage = TokenUsage(**usage_values, estimated=True, estimate_reason="no_usage", cost=costs)
    ctx = RequestContext("req-fields", "/v1/chat/completions")
    ctx.delivered = True
    record = make_record(ctx, usage, tenant="acme", ts_ms=1)
    assert len(numeric) >= 9  # system, history, new, tools, cached, cache_write, output, ...
    for name, value in usage_values.items():
        assert getattr(record, name) == value, name
    assert record.estimated is True and record.estimate_reason == "no_usage"
    for name in cost_names:
        field = _COST_FIELDS.get(name, f"cost_{name}")
        assert field in record_fields, field
        assert getattr(record, field) == getattr(costs, name), field
