"""Prices per model and the cost of one request, in integer micro-units of the currency.

Policy gives prices per million tokens as decimal strings (``"2.50"``); they are held as integer
micro-units per million tokens (``2_500_000``), so a price has at most six decimal places and no
float is used anywhere. A price may carry a batch factor: the multiplier for batch-class requests
(``"0.5"`` = half price), held as an exact integer ratio.

Cost of a request (:func:`price_usage`): every token is in exactly one bucket and each bucket has
its own price, so nothing is charged twice.

* input: the prompt's parts (system, history, new, tools) sum to the prompt total. Of that total,
  the tokens the backend read from its cache are priced at ``cached_input``, the tokens it wrote
  to its cache at ``cache_write_input`` (default: the input price), the rest at ``input``.
  Cached tokens are taken from history first, then system, tools, and new: history is what a
  chat client re-sends each turn and what a prefix cache holds, and its own line is where a
  customer looks for the saving. Cache writes are taken from what the read left, in prompt order
  (system, tools, history, new): a write extends the cached prefix past the part that was read.
* output: the completion tokens, reasoning included, split into visible output (priced at
  ``output``, the ``output`` line) and reasoning (priced at ``reasoning``, default: the output
  price, the ``reasoning`` line).
* rounding: the exact total (a fraction of a micro-unit) is rounded half-to-even once; each line
  (system, history, new, tools, output, reasoning) is the floor or the ceiling of its exact
  value, chosen by largest remainder so that the lines sum exactly to the total. Half-even
  carries no bias over many requests; rounding up each request would overcharge by half a
  micro-unit on average.
* ``cached`` and ``cache_write`` are informational: the parts of the total charged at the
  cache-read and cache-write rates (already in the input lines), each rounded half-to-even.
* ``continuation``: a stream continued on another backend (``pools[].continuation``) sent that
  backend its prompt again plus the text already streamed; those tokens at the uncached input
  price (:func:`price_continuation`, rounded half-to-even) are the operator's cost line. It is
  in the total only when the policy bills it (``continuation.billed``); the other lines sum to
  the total either way, without it.
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
    "price_continuation",
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
    #: prompt tokens written to the backend's cache; None: the input price
    cache_write_input: int | None = None
    #: reasoning tokens (a part of the output); None: the output price
    reasoning: int | None = None

    @classmethod
    def parse(
        cls,
        *,
        input: Amount,
        output: Amount,
        cached_input: Amount | None = None,
        batch_factor: Amount | None = None,
        cache_write_input: Amount | None = None,
        reasoning: Amount | None = None,
    ) -> ModelPrice:
        """From policy amounts; cached input and cache write default to the input price,
        reasoning to the output price."""
        micros = to_micros(input)
        out = to_micros(output)
        return cls(
            input=micros,
            cached_input=micros if cached_input is None else to_micros(cached_input),
            output=out,
            batch_factor=(1, 1) if batch_factor is None else _ratio(batch_factor),
            cache_write_input=micros if cache_write_input is None else to_micros(
                cache_write_input),
            reasoning=out if reasoning is None else to_micros(reasoning),
        )

    @property
    def write_rate(self) -> int:
        """The cache-write price in force (the input price unless set)."""
        return self.input if self.cache_write_input is None else self.cache_write_input

    @property
    def reasoning_rate(self) -> int:
        """The reasoning price in force (the output price unless set)."""
        return self.output if self.reasoning is None else self.reasoning

    def ceiling(self) -> ModelPrice:
        """The most a token can cost at these prices: every input bucket at the dearest input
        rate, every output bucket at the dearer of output and reasoning. Prices with it the
        most a request can cost before the backend says how its tokens split."""
        top_in = max(self.input, self.cached_input, self.write_rate)
        top_out = max(self.output, self.reasoning_rate)
        return ModelPrice(input=top_in, cached_input=top_in, output=top_out,
                          batch_factor=self.batch_factor, cache_write_input=top_in,
                          reasoning=top_out)


class CostBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Cost of one request by line, in micro-units; the lines sum to ``total`` (plus
    ``continuation`` when it is billed)."""

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
    #: a continued stream's continuation prompts at the uncached input price: the operator's
    #: cost; in ``total`` only when billed to the tenant (``continuation.billed``)
    continuation: int = 0


def price_usage(
    price: ModelPrice,
    *,
    system: int = 0,
    history: int = 0,
    new: int = 0,
    tools: int = 0,
    cached: int = 0,
    cache_write: int = 0,
    output: int = 0,
    reasoning: int = 0,
    batch: bool = False,
) -> CostBreakdown:
    """The cost of a request's tokens at ``price`` (see the module docstring for the rules).

    ``cached`` and ``cache_write`` are parts of the prompt (system + history + new + tools),
    ``reasoning`` a part of ``output`` (the completion tokens in all); parts larger than what
    they are parts of are clamped to it.
    """
    num, den = price.batch_factor if batch else (1, 1)
    parts = [max(0, p) for p in (system, history, new, tools)]
    hits = _take(cached, parts, _CACHED_ORDER)
    left = [p - h for p, h in zip(parts, hits, strict=True)]
    writes = _take(cache_write, left, _WRITE_ORDER)
    write_rate = price.write_rate
    exact = [
        ((rest - write) * price.input + hit * price.cached_input + write * write_rate) * num
        for rest, hit, write in zip(left, hits, writes, strict=True)
    ]
    output = max(0, output)
    thinking = min(max(0, reasoning), output)
    exact.append((output - thinking) * price.output * num)
    exact.append(thinking * price.reasoning_rate * num)
    denominator = MICROS * den
    lines, total = _round_lines(exact, denominator)
    return CostBreakdown(
        system=lines[0],
        history=lines[1],
        new=lines[2],
        tools=lines[3],
        output=lines[4],
        reasoning=lines[5],
        total=total,
        cached=_half_even(sum(hits) * price.cached_input * num, denominator),
        cache_write=_half_even(sum(writes) * write_rate * num, denominator),
    )


def price_continuation(price: ModelPrice, tokens: int, *, batch: bool = False) -> int:
    """The cost of ``tokens`` continuation prompt tokens (the prompt plus the text already
    sent, for each continuation of a stream): the uncached input price, the request's batch
    factor applied, rounded half-to-even."""
    num, den = price.batch_factor if batch else (1, 1)
    return _half_even(max(0, tokens) * price.input * num, MICROS * den)


#: indices into [system, history, new, tools]: where cache reads, and cache writes, are taken
_CACHED_ORDER = (1, 0, 3, 2)  # history, system, tools, new
_WRITE_ORDER = (0, 3, 1, 2)  # prompt order: system, tools, history, new


def _take(count: int, parts: list[int], order: tuple[int, ...]) -> list[int]:
    """``count`` tokens taken from ``parts`` in ``order``, each part at most its size."""
    taken = [0] * len(parts)
    left = max(0, count)
    for i in order:
        taken[i] = min(left, parts[i])
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

    __slots__ = ("_models", "_tenants", "bill_failed", "currency")

    def __init__(
        self,
        models: Mapping[str, ModelPrice],
        *,
        tenants: Mapping[str, Mapping[str, ModelPrice]] | None = None,
        currency: str = "USD",
        bill_failed: bool = False,
    ) -> None:
        self._models = dict(models)
        self._tenants = {t: dict(m) for t, m in (tenants or {}).items()}
        self.currency = currency
        #: charge requests that failed before any output (default: they cost 0)
        self.bill_failed = bill_failed

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PriceTable:
        """From policy: ``{currency, batch_factor, bill_failed, models: {name: {input,
        cached_input, cache_write_input, output, reasoning, batch_factor}}, tenants: {tenant:
        {model: {...}}}}``, amounts per million tokens.

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
        bill_failed = data.get("bill_failed", False)
        if not isinstance(bill_failed, bool):
            raise ValueError(f"bill_failed is true or false, got {bill_failed!r}")
        return cls(models, tenants=tenants, currency=str(data.get("currency", "USD")),
                   bill_failed=bill_failed)

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
            f"{len(self._tenants)} tenants with overrides | {self.currency}"
            f"{' | bill failed' if self.bill_failed else ''}]>"
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
            cache_write_input=merged.get("cache_write_input"),
            reasoning=merged.get("reasoning"),
        )
    except KeyError as exc:
        raise ValueError(f"price entry needs {exc.args[0]!r}: {dict(entry)!r}") from exc
