"""The statistics the gates decide with: tests that fail only when the data show, at the
rollout's confidence level, that the canary is worse than its bound.

Why these tests: a canary at 1% sees few requests, and a gate that compared point estimates
(error rate 0.5% vs 0.4%, a p90 of 212 ms vs 198 ms) would flip on noise and roll back healthy
versions. Each test here has a one-sided null hypothesis "the canary is within its bound" and
rejects it only at the chosen confidence:

- error rate: the difference of two proportions with a margin, Agresti-Caffo adjusted (one
  success and one failure added to each arm, so zero counts still have a variance);
- a latency p90: an order-statistic upper confidence bound of the baseline's p90 (no
  bootstrap), times the allowed ratio, is the threshold; under the null at most 10% of the
  canary's requests exceed it, so the count that does is tested against Binomial(n, 0.1)
  (a sign test on exceedances);
- mean output tokens: a Welch z-test on the ratio of means, both sides;
- shadow agreement: a Wilson upper bound on the agreement rate.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = [
    "binomial_cdf",
    "binomial_sf",
    "difference_exceeds",
    "exceedances_exceed",
    "mean_ratio_outside",
    "order_statistic_upper",
    "wilson_upper",
    "z_for",
]

_NORMAL = NormalDist()
#: above this many trials the binomial tail is the normal approximation (continuity-corrected)
_EXACT_MAX = 5000


def z_for(confidence: float) -> float:
    """The one-sided standard normal quantile of ``confidence`` (0.95 -> 1.645)."""
    return _NORMAL.inv_cdf(confidence)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    if n > _EXACT_MAX:
        sd = math.sqrt(n * p * (1 - p))
        return _NORMAL.cdf((k + 0.5 - n * p) / sd)
    log_p, log_q = math.log(p), math.log1p(-p)
    log_pmf = n * log_q  # P(X = 0)
    total = math.exp(log_pmf)
    for i in range(1, k + 1):
        log_pmf += math.log(n - i + 1) - math.log(i) + log_p - log_q
        total += math.exp(log_pmf)
    return min(1.0, total)


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) >= k)."""
    return 1.0 - binomial_cdf(k - 1, n, p)


def difference_exceeds(errors_c: int, n_c: int, errors_b: int, n_b: int, margin: float,
                       confidence: float) -> tuple[bool, float]:
    """Whether the canary's rate exceeds the baseline's by more than ``margin`` at
    ``confidence`` (H0: p_c - p_b <= margin), and the test's z."""
    pc = (errors_c + 1) / (n_c + 2)
    pb = (errors_b + 1) / (n_b + 2)
    se = math.sqrt(pc * (1 - pc) / (n_c + 2) + pb * (1 - pb) / (n_b + 2))
    z = (pc - pb - margin) / se
    return z > z_for(confidence), z


def order_statistic_upper(m: int, q: float, confidence: float) -> int | None:
    """The rank j (1-based) of the order statistic of ``m`` samples that bounds the ``q``
    quantile from above with ``confidence``: P(X_(j) >= x_q) >= confidence. None when ``m``
    samples are too few for any rank to do so."""
    # X_(j) >= x_q  <=>  fewer than j samples fall below x_q; that count is Binomial(m, q):
    # j - 1 is the smallest k with P(Binomial(m, q) <= k) >= confidence
    if m <= 0:
        return None
    if m > _EXACT_MAX:
        sd = math.sqrt(m * q * (1 - q))
        k = math.ceil(m * q + z_for(confidence) * sd - 0.5)
        return k + 1 if k + 1 <= m else None
    log_p, log_q = math.log(q), math.log1p(-q)
    log_pmf = m * log_q
    total = math.exp(log_pmf)
    for k in range(m):  # one pass over the pmf, cumulated
        if total >= confidence:
            return k + 1
        log_pmf += math.log(m - k) - math.log(k + 1) + log_p - log_q
        total += math.exp(log_pmf)
    return None


def exceedances_exceed(k: int, n: int, share: float, confidence: float) -> tuple[bool, float]:
    """Whether ``k`` of ``n`` samples above a threshold show, at ``confidence``, that more than
    ``share`` of the population lies above it; and the p-value."""
    if n == 0:
        return False, 1.0
    p_value = binomial_sf(k, n, share)
    return p_value < 1 - confidence, p_value


def mean_ratio_outside(mean_c: float, var_c: float, n_c: int, mean_b: float, var_b: float,
                       n_b: int, change: float, confidence: float) -> tuple[bool, float]:
    """Whether the canary's mean is shown (at ``confidence``) to lie outside
    [(1 - change), (1 + change)] x the baseline's; and the larger of the two z's."""
    z_crit = z_for(confidence)
    worst = -math.inf
    for factor in (1 + change, 1 - change):
        if factor <= 0:
            continue
        se = math.sqrt(var_c / max(n_c, 1) + factor * factor * var_b / max(n_b, 1))
        if se == 0:
            se = 1e-9
        diff = mean_c - factor * mean_b
        z = diff / se if factor > 1 else -diff / se
        worst = max(worst, z)
    return worst > z_crit, worst


def wilson_upper(successes: int, n: int, confidence: float) -> float:
    """The one-sided Wilson upper confidence bound of a proportion."""
    if n == 0:
        return 1.0
    z = z_for(confidence)
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z * z / n))
