"""The quota store's pre-encoded reserve and settle are byte for byte the generic encoding,
for tenants on their own and inside organizations (another hash tag, a calendar, alerts)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.quota.base import QuotaRequest, Reservation
from gateway.quota.limits import AlertRule, Limits, Partition, Scope
from gateway.quota.redis import RedisQuotaStore
from gateway.redis import PipelinedRedis, encode_command

_limit = st.none() | st.integers(min_value=0, max_value=2**50)
_partition = st.none() | st.builds(
    Partition, organization=st.sampled_from(["bigco", "o.2"]),
    timezone=st.sampled_from(["UTC", "Europe/Paris", "Pacific/Kiritimati"]))
_alerts = st.none() | st.builds(
    AlertRule, level=st.sampled_from(["organization", "team", "tenant", "key"]),
    subject=st.just("s"), thresholds=st.lists(st.integers(1, 100), min_size=1,
                                              max_size=4).map(tuple))


def _with_partition(partition: Partition | None, scopes: list[Scope]) -> tuple[Scope, ...]:
    return tuple(Scope(s.name, s.limits, s.unit, partition, s.alerts) for s in scopes)


_scopes = st.builds(_with_partition, _partition, st.lists(
    st.builds(Scope, name=st.text(min_size=1, max_size=15).filter(
        lambda n: "{" not in n and "}" not in n),
        limits=st.builds(Limits, rpm=_limit, tpm=_limit, concurrency=_limit,
                         tokens_per_day=_limit, tokens_per_month=_limit),
        unit=st.sampled_from(["tokens", "cost"]), alerts=_alerts),
    min_size=1, max_size=4, unique_by=lambda s: s.name))
_tenants = st.text(min_size=1, max_size=12).filter(lambda t: "{" not in t and "}" not in t)
_counts = st.integers(min_value=0, max_value=2**60)


def _store() -> RedisQuotaStore:
    return RedisQuotaStore(PipelinedRedis("127.0.0.1", 9))  # never connects


@settings(max_examples=200, deadline=None)
@given(tenant=_tenants, scopes=_scopes, request_ids=st.lists(st.text(min_size=1, max_size=30),
                                                             min_size=1, max_size=4),
       estimate=_counts, cost=_counts, lease=st.sampled_from([30.0, 0.5, 2.25]),
       used=_counts, spent=st.integers(min_value=-1, max_value=2**60),
       refusal_alerts=st.booleans())
def test_pre_encoded_commands_equal_the_generic_encoding(
        tenant: str, scopes: tuple[Scope, ...], request_ids: list[str], estimate: int,
        cost: int, lease: float, used: int, spent: int, refusal_alerts: bool) -> None:
    store = _store()
    for rid in request_ids * 2:  # the second pass reads the cached parts
        request = QuotaRequest(request_id=rid, tenant=tenant, scopes=scopes,
                               estimated_tokens=estimate, estimated_cost=cost, lease_ttl=lease,
                               refusal_alerts=refusal_alerts)
        keys, args = store._reserve_args(request)
        reserve = ("EVALSHA", store._reserve.sha, len(keys), *keys, *args)
        assert store._reserve_encoded(request) == encode_command(reserve)
        reservation = Reservation(request_id=rid, tenant=tenant, scopes=scopes,
                                  estimated_tokens=estimate, lease_ttl=lease, expires_at=0.0,
                                  origin="redis")
        keys, args = store._settle_args(reservation, used, spent)
        assert args[:4] == [rid, used, store._window_us, spent]
        generic = ("EVALSHA", store._settle.sha, len(keys), *keys, *args)
        assert store._settle_encoded(reservation, used, spent) == encode_command(generic)
