"""Prices per model and the cost of one request, in integer micro-units of the currency.

Policy gives prices per million tokens as decimal strings (``"2.50"``); they are held as integer
micro-units per million tokens (``2_500_000``), so a price has at most six decimal places and no
float is used anywhere. A price may carry a batch factor: the multiplier for batch-class requests
(``"0.5"`` = half price), held as an exact integer ratio.

Cost of a request (:func:`price_usage`):

* every part of the prompt (system, history, new, tools) is priced as input, except the tokens
  the backend reported as cached, which are priced as cached input. Cached tokens are taken from
  history first, then system, tools, and new: history is what a chat client re-sends each turn and
  what a prefix cache holds, and its own line is where a customer looks for the saving.
* output tokens are priced as output.
* rounding: the exact total (a fraction of a micro-unit) is rounded half-to-even once; each line
  is the floor or the ceiling of its exact value, chosen by largest remainder so that the lines
  sum exactly to the total. Half-even carries no bias over many requests; rounding up each
  request would overcharge by half a micro-unit on average.
* ``cached`` is informational: the part of the total charged at the cached rate (already in the
  lines), rounded half-to-even on its own.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MICROS",
    "CostBreakdown",
    "ModelPrice",
    "PriceTable",
    "format_micros",
    "price_usage",
    "to_micros",
]

#: Micro-units per currency unit; also tokens per price unit (prices are per million tokens).
MICROS = 1_000_000

Amount = Decimal | str | int | float


def to_micros(value: Amount) -> int:
    """A non-negative decimal amount as integer micro-units; more than 6 decimals is an error.

    A float (an unquoted YAML number) is read through its shortest repr, which is the literal the
    policy author wrote, so ``2.5`` reads as ``Decimal("2.5")``, never as the binary fraction.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a price: {value!r}")
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value))
    except InvalidOperation as exc:
        raise ValueError(f"not a decimal amount: {value!r}") from exc
    scaled = amount * MICROS
    if not scaled.is_finite() or scaled != scaled.to_integral_value() or scaled < 0:
        raise ValueError(f"amount must be >= 0 with at most 6 decimal places: {value!r}")
    return int(scaled)


def format_micros(micros: int) -> str:
    """Micro-units as a decimal string with six places: ``1234567`` -> ``"1.234567"``."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS)
    return f"{sign}{whole}.{frac:06d}"


def _ratio(value: Amount) -> tuple[int, int]:
    """A factor in (0, 1] as an exact, reduced (numerator, denominator)."""
    micros = to_micros(value)
    if not 0 < micros <= MICROS:
        raise ValueError(f"a batch factor is in (0, 1], got {value!r}")
    common = math.gcd(micros, MICROS)
    return micros // common, MICROS // common


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True):
    """One model's prices, in micro-units per million tokens."""

    input: int
    cached_input: int
    output: int
    #: multiplier for batch requests as (numerator, denominator); (1, 1) means full price
    batch_factor: tuple[int, int] = (1, 1)

    @classmethod
    def parse(
        cls,
        *,
        input: Amount,
        output: Amount,
        cached_input: Amount | None = None,
        batch_factor: Amount | None = None,
    ) -> ModelPrice:
        """From policy amounts; cached input defaults to the input price."""
        micros = to_micros(input)
        return cls(
            input=micros,
            cached_input=micros if cached_input is None else to_micros(cached_input),
            output=to_micros(output),
            batch_factor=(1, 1) if batch_factor is None else _ratio(batch_factor),
        )


class CostBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Cost of one request by line, in micro-units; the lines sum to ``total``."""

    system: int = 0
    history: int = 0
    new: int = 0
    tools: int = 0
    #: visible output (completion tokens less reasoning)
    output: int = 0
    #: reasoning tokens, at the model's reasoning price
    reasoning: int = 0
    total: int = 0
    #: of the total, what was charged at the cached-input rate (not a separate line)
    cached: int = 0
    #: of the total, what was charged at the cache-write rate (not a separate line)
    cache_write: int = 0


def price_usage(
    price: ModelPrice,
    *,
    system: int = 0,
    history: int = 0,
    new: int = 0,
    tools: int = 0,
    cached: int = 0,
    output: int = 0,
    batch: bool = False,
) -> CostBreakdown:
    """The cost of a request's tokens at ``price`` (see the module docstring for the rules)."""
    num, den = price.batch_factor if batch else (1, 1)
    parts = [system, history, new, tools]
    cached_parts = _take_cached(cached, parts)
    exact = [
        ((tokens - hit) * price.input + hit * price.cached_input) * num
        for tokens, hit in zip(parts, cached_parts, strict=True)
    ]
    exact.append(output * price.output * num)
    denominator = MICROS * den
    lines, total = _round_lines(exact, denominator)
    return CostBreakdown(
        system=lines[0],
        history=lines[1],
        new=lines[2],
        tools=lines[3],
        output=lines[4],
        total=total,
        cached=_half_even(sum(cached_parts) * price.cached_input * num, denominator),
    )


def _take_cached(cached: int, parts: list[int]) -> list[int]:
    """Cached tokens per part [system, history, new, tools]: history, then system, tools, new."""
    taken = [0, 0, 0, 0]
    left = max(0, cached)
    for i in (1, 0, 3, 2):
        taken[i] = min(left, max(0, parts[i]))
        left -= taken[i]
    return taken


def _half_even(numerator: int, denominator: int) -> int:
    quotient, rest = divmod(numerator, denominator)
    if 2 * rest > denominator or (2 * rest == denominator and quotient % 2):
        quotient += 1
    return quotient


def _round_lines(exact: list[int], denominator: int) -> tuple[list[int], int]:
    """Lines as floor/ceil of exact/denominator summing to the half-even rounded total."""
    total = _half_even(sum(exact), denominator)
    lines = [e // denominator for e in exact]
    left = total - sum(lines)
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] % denominator), i))
    for i in order[:left]:
        lines[i] += 1
    return lines, total


class PriceTable:
    """Prices by model, with per-tenant overrides; built once from policy, shared read-only."""

    __slots__ = ("_models", "_tenants", "currency")

    def __init__(
        self,
        models: Mapping[str, ModelPrice],
        *,
        tenants: Mapping[str, Mapping[str, ModelPrice]] | None = None,
        currency: str = "USD",
    ) -> None:
        self._models = dict(models)
        self._tenants = {t: dict(m) for t, m in (tenants or {}).items()}
        self.currency = currency

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PriceTable:
        """From policy: ``{currency, batch_factor, models: {name: {input, cached_input, output,
        batch_factor}}, tenants: {tenant: {model: {...}}}}``, amounts per million tokens.

        A tenant override may give only some prices; the rest come from the model's own entry.
        ``batch_factor`` at the top is the default for every model.
        """
        default_factor = data.get("batch_factor")
        raw_models: Mapping[str, Mapping[str, Any]] = data.get("models") or {}
        models = {
            name: _parse_price(entry, {}, default_factor) for name, entry in raw_models.items()
        }
        tenants = {
            tenant: {
                name: _parse_price(entry, raw_models.get(name, {}), default_factor)
                for name, entry in overrides.items()
            }
            for tenant, overrides in (data.get("tenants") or {}).items()
        }
        return cls(models, tenants=tenants, currency=str(data.get("currency", "USD")))

    def lookup(self, model: str, tenant: str | None = None) -> ModelPrice | None:
        """The tenant's price for the model if it has one, else the model's, else None."""
        if tenant is not None:
            override = self._tenants.get(tenant)
            if override is not None and model in override:
                return override[model]
        return self._models.get(model)

    def __repr__(self) -> str:
        return (
            f"<PriceTable [{len(self._models)} models | "
            f"{len(self._tenants)} tenants with overrides | {self.currency}]>"
        )


def _parse_price(
    entry: Mapping[str, Any], base: Mapping[str, Any], default_factor: Amount | None
) -> ModelPrice:
    merged = {**base, **entry}
    try:
        return ModelPrice.parse(
            input=merged["input"],
            output=merged["output"],
            cached_input=merged.get("cached_input"),
            batch_factor=merged.get("batch_factor", default_factor),
        )
    except KeyError as exc:
        raise ValueError(f"price entry needs {exc.args[0]!r}: {dict(entry)!r}") from exc
