"""Fault settings: flags as defaults, x-sim-* headers override."""

from __future__ import annotations

import random

import pytest

from gateway.sim.faults import FaultConfig, FaultHeaderError, parse_faults


def test_no_headers_keeps_defaults() -> None:
    defaults = FaultConfig(stall_ms=5.0)
    assert parse_faults([(b"content-type", b"x")], defaults) is defaults


def test_headers_override_and_status_implies_rate_one() -> None:
    """A status header without a rate header means 'always', whatever the default rate."""
    defaults = FaultConfig(error_status=503, error_rate=0.0, stall_ms=5.0)
    headers = [(b"X-Sim-Error-Status", b"500"), (b"x-sim-disconnect-after", b"3")]
    f = parse_faults(headers, defaults)
    assert (f.error_status, f.error_rate, f.disconnect_after, f.stall_ms) == (500, 1.0, 3, 5.0)
    assert f.error_to_inject(random.Random(0)) == 500


@pytest.mark.parametrize(
    ("rate", "expected"), [pytest.param(0.0, 0, id="never"), pytest.param(1.0, 200, id="always")]
)
def test_error_rate(rate: float, expected: int) -> None:
    f = FaultConfig(error_status=500, error_rate=rate)
    rng = random.Random(1)
    assert sum(f.error_to_inject(rng) == 500 for _ in range(200)) == expected


def test_partial_rate_is_a_probability() -> None:
    f = FaultConfig(error_status=500, error_rate=0.3)
    rng = random.Random(1)
    hits = sum(f.error_to_inject(rng) is not None for _ in range(2000))
    assert 500 < hits < 700


def test_bad_header_value() -> None:
    with pytest.raises(FaultHeaderError, match="x-sim-stall-ms"):
        parse_faults([(b"x-sim-stall-ms", b"soon")], FaultConfig())


def test_no_faults_inactive() -> None:
    assert not FaultConfig().active
    assert FaultConfig().error_to_inject(random.Random(0)) is None
