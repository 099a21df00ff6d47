"""Largest-remainder apportionment sums exactly, stays within one of each quota, is stable."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.accounting import PromptSplit, apportion, fit_split

weights = st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=6)
totals = st.integers(min_value=0, max_value=200_000)


@given(total=totals, w=weights)
def test_sums_exactly_never_negative_within_one(total: int, w: list[int]) -> None:
    parts = apportion(total, w)
    assert sum(parts) == total
    assert all(p >= 0 for p in parts)
    if sum(w):
        for part, weight in zip(parts, w, strict=True):
            assert abs(part - Fraction(weight * total, sum(w))) < 1
    assert apportion(total, w) == parts  # deterministic


@given(total=totals, w=weights)
def test_zero_weight_gets_nothing(total: int, w: list[int]) -> None:
    if sum(w):
        parts = apportion(total, w)
        assert all(p == 0 for p, weight in zip(parts, w, strict=True) if weight == 0)


@given(total=totals, w=weights, k=st.integers(min_value=1, max_value=50))
def test_scaling_weights_changes_nothing(total: int, w: list[int], k: int) -> None:
    """Only the proportions matter: weights times k give the same parts."""
    assert apportion(total, [x * k for x in w]) == apportion(total, w)


@given(total=totals, w=weights)
def test_monotone_in_total_within_one(total: int, w: list[int]) -> None:
    """One more token never takes more than one token from any part (Hamilton's bound)."""
    a, b = apportion(total, w), apportion(total + 1, w)
    assert all(y >= x - 1 for x, y in zip(a, b, strict=True))


def test_ties_go_to_the_earlier_part() -> None:
    assert apportion(1, [1, 1, 1]) == [1, 0, 0]
    assert apportion(2, [1, 1, 1]) == [1, 1, 0]


def test_all_zero_weights_go_to_fallback() -> None:
    assert apportion(5, [0, 0, 0], fallback=2) == [0, 0, 5]


def test_rejects_negatives() -> None:
    with pytest.raises(ValueError):
        apportion(-1, [1])
    with pytest.raises(ValueError):
        apportion(1, [1, -1])


@given(
    parts=st.tuples(*[st.integers(min_value=0, max_value=5000)] * 4),
    prompt_tokens=totals,
)
def test_fit_split_sums_to_backend_figure(
    parts: tuple[int, int, int, int], prompt_tokens: int
) -> None:
    system, history, new, tools = parts
    split = PromptSplit(system=system, history=history, new=new, tools=tools, non_text_parts=1)
    fitted = fit_split(split, prompt_tokens)
    assert fitted.total == prompt_tokens
    assert min(fitted.system, fitted.history, fitted.new, fitted.tools) >= 0
    assert fitted.non_text_parts == 1
    if split.total == 0:
        assert fitted.new == prompt_tokens


def test_fit_split_hand_example() -> None:
    """100/300/100/0 scaled to 1001: quotas 200.2/600.6/200.2 -> the spare token to history."""
    split = PromptSplit(system=100, history=300, new=100)
    assert fit_split(split, 1001) == PromptSplit(system=200, history=601, new=200)
