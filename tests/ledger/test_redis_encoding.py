"""The ledger's pre-encoded EVALSHA is byte for byte what the generic encoder writes."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from gateway.ledger.record import UsageRecord
from gateway.ledger.redis import RedisLedger
from gateway.redis import PyRedis, encode_command

_names = st.text(min_size=1, max_size=12)
_counts = st.integers(min_value=0, max_value=2**40)

_records = st.builds(
    UsageRecord,
    request_id=st.text(min_size=1, max_size=40),
    ts_ms=st.integers(min_value=0, max_value=4_102_444_800_000),  # to 2100
    tenant=st.sampled_from(["acme", "t|2", "ünï", "a:b"]) | _names,
    model=st.sampled_from(["m", "gpt|x", "50%"]) | _names,
    request_class=st.sampled_from(["interactive", "batch"]),
    batch_id=st.none() | st.sampled_from(["b1", "b|%"]),
    system=_counts, history=_counts, new=_counts, tools=_counts, cached=_counts,
    output=_counts, prompt_total=_counts, estimated=st.booleans(), cost_micros=_counts,
)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(_records, min_size=1, max_size=6))
def test_encoded_equals_generic_encoding(tmp_path_factory: object, records: list[UsageRecord]
                                         ) -> None:
    spool = Path(tmp_path_factory.mktemp("spool"))
    ledger = RedisLedger(PyRedis(Redis.from_url("redis://127.0.0.1:9")), spool_dir=spool)
    for record in records * 2:  # the second pass reads the cached parts
        generic = encode_command(("EVALSHA", ledger._sha, 4, *ledger._script_args(record)))
        assert ledger._encoded(record) == generic
