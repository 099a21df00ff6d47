"""The noisy-neighbour bench's split of a tenant's requests by its own others in flight."""

from __future__ import annotations

import pytest

from loadtest.bench.fairness_bench import by_own_company


def test_requests_split_by_whether_another_of_the_tenant_was_in_flight() -> None:
    spans: list[tuple[float, float | None, float]] = [
        (0.0, 0.1, 2.0),  # nothing else in flight: alone
        (1.0, 1.3, 3.0),  # the first is in flight
        (5.0, 5.2, 6.0),  # both ended: alone
        (5.5, None, 7.0),  # no first chunk: left out
        (5.6, 5.7, 8.0),  # the third (and the fourth) in flight
    ]
    got = by_own_company(list(reversed(spans)))  # in any order
    assert got["sent_alone_share"] == pytest.approx(2 / 4)
    assert got["sent_alone_ttft_p50_ms"] == pytest.approx(200.0)
    assert got["sent_alone_ttft_p99_ms"] == pytest.approx(200.0)
    assert got["sent_with_own_ttft_p50_ms"] == pytest.approx(300.0)
    assert got["sent_with_own_ttft_p99_ms"] == pytest.approx(300.0)
