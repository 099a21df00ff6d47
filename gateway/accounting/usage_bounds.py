"""What the gateway believes of a backend's token counts, and why it would not.

A backend's usage is what the tenant is billed, what settles the quota and what the ledger
stores, so it is input from outside like any other: a backend that answers
``"prompt_tokens": 1e30`` (or ``10**30``, ``"12"``, ``true``, ``null``, ``-1``) must not become
a bill, an overflow that keeps the record out of the database, or a quota spent forever.
Two checks, at the two moments they can be made:

* reading (:func:`first_problem`, called by ``usage.py`` for every shape, whole and streamed):
  each figure is a JSON integer >= 0. A total (prompt, completion, total, input, output) that is
  null, not an integer or negative refuses the usage, and so does an absent prompt total (there
  is no honest 0 prompt). A part (cache read, cache write, reasoning, a cache split) may be
  absent or null: that only says the backend did not split its total (LiteLLM writes null for
  every detail it has not got; Anthropic documents its cache figures as nullable, meaning
  none), so it reads as 0 (a part of a total, it moves no token out of the bill); any other
  value is held to the same rule as a total.
* accounting (:func:`check`): the figures fit the request they answer. The prompt is at most
  ``PROMPT_FACTOR`` times the gateway's own count of it plus ``PROMPT_SLACK`` (tokenizers differ,
  templates add framing; a prompt with images or files, whose tokens the gateway can only guess,
  is held to the context window or ``CEILING`` instead); the output is at most the request's
  max output tokens times its choices (embeddings: none; no limit set: the model's
  ``max_output_tokens``); with the model's context length known (``UsageLimits.context``: the
  policy has no key for it yet) neither exceeds it; no count exceeds ``CEILING``.

A usage that fails either check is not billed: the gateway's own counts are (the prompt as it
counted it, the output from the delivered text: the same estimate as for an answer without
usage), the record is marked ``estimated`` with the reason (``"too_large:prompt_tokens"``,
``"null:completion_tokens"``, ...; ``"no_usage"`` when there was none), and the pipeline counts
the rejection per backend (``gateway_backend_usage_rejected_total``). The reasons are the
gateway's own words and field names, never text from the backend, so the record and the metric
stay bounded. Everything here is a pure function of its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.accounting.split import PromptSplit
    from gateway.accounting.usage import BackendUsage

__all__ = [
    "CEILING",
    "KINDS",
    "MALFORMED",
    "MISSING",
    "NEGATIVE",
    "NOT_INTEGER",
    "NO_USAGE",
    "NULL",
    "PROMPT_FACTOR",
    "PROMPT_SLACK",
    "TOO_LARGE",
    "UsageLimits",
    "bounds",
    "check",
    "count_problem",
    "first_problem",
    "rejection_kind",
    "request_limits",
    "screen",
]

#: the backend reported no usage at all (an estimate, but not a rejection)
NO_USAGE = "no_usage"
#: a total the shape requires is absent (a usage without its prompt total)
MISSING = "missing"
#: a total is JSON null
NULL = "null"
#: a figure is a float (``1e30``, ``12.0``), a string, a boolean, an array or an object
NOT_INTEGER = "not_integer"
NEGATIVE = "negative"
#: a figure is above what the request can have used
TOO_LARGE = "too_large"
#: the usage (or one of its detail objects) is not a JSON object
MALFORMED = "malformed"
#: the kinds of rejection: the metric's ``reason`` label takes only these
KINDS = (MISSING, NULL, NOT_INTEGER, NEGATIVE, TOO_LARGE, MALFORMED)

#: how many times the gateway's own count a backend's prompt count may be: tokenizers differ
#: (the gateway counts with o200k/cl100k, a model with its own, up to about twice as many
#: tokens for some scripts), chat templates frame each message, tool schemas render apart
PROMPT_FACTOR = 4
#: and a fixed allowance on top, for what a backend adds to any prompt: a default system
#: prompt, a tool-use preamble (Anthropic's is some hundreds of tokens), a tiny prompt's framing
PROMPT_SLACK = 2048
#: no count above this is believed, whatever the request: beyond the largest context window
#: offered (about 10M tokens), and far inside the ledger's narrowest column (32-bit integers)
CEILING = 1 << 24


def count_problem(value: object) -> str | None:
    """Why ``value`` is not a token count (None: it is one). ``bool`` is an ``int`` in Python
    but ``true`` is no count, so the type is compared exactly."""
    if type(value) is int:
        return NEGATIVE if value < 0 else None
    return NULL if value is None else NOT_INTEGER


def first_problem(totals: Mapping[str, Any], parts: Mapping[str, Any] | None = None, *,
                  required: str | None = None) -> str | None:
    """The reason one usage object's figures cannot be billed (``"<kind>:<field>"``), or None.

    ``totals`` and ``parts`` map each figure's name to its value as decoded, ``msgspec.UNSET``
    for an absent one. A present total must be a count; ``required`` (a total's name) must be
    present. A part may be absent or null (not split: read as 0), else it must be a count.
    """
    if required is not None and totals.get(required, msgspec.UNSET) is msgspec.UNSET:
        return f"{MISSING}:{required}"
    for name, value in totals.items():
        if value is not msgspec.UNSET:
            problem = count_problem(value)
            if problem is not None:
                return f"{problem}:{name}"
    for name, value in (parts or {}).items():
        if value is not msgspec.UNSET and value is not None:
            problem = count_problem(value)
            if problem is not None:
                return f"{problem}:{name}"
    return None


def rejection_kind(reason: str | None) -> str | None:
    """The kind of a rejection reason (its metric label), None for no reason or ``no_usage``
    (a backend that reported nothing rejected nothing)."""
    if reason is None:
        return None
    kind = reason.partition(":")[0]
    return kind if kind in KINDS else None


@dataclass(frozen=True, slots=True)
class UsageLimits:
    """What the request itself allows its usage to be, beside the prompt's own count."""

    #: the most output tokens in all (max output tokens x choices); None: no limit was set
    output: int | None = None
    #: the model's context window (prompt + output of one choice); None: not known
    context: int | None = None
    #: choices generated (``n``, ``best_of``): each may fill the context window
    choices: int = 1


def _positive(value: object) -> int:
    return value if type(value) is int and value > 0 else 0


def request_limits(payload: Mapping[str, Any], operation: str, *,
                   default_output: int | None = None,
                   context: int | None = None) -> UsageLimits:
    """The limits of one request (its chat-shaped payload: Responses and Messages requests are
    carried as chat, their ``max_output_tokens`` / ``max_tokens`` as ``max_tokens``).
    ``default_output``: the model's output ceiling, for a request that sets no limit."""
    if operation == "embeddings":
        return UsageLimits(output=0, context=context)
    choices = max(_positive(payload.get("n")), _positive(payload.get("best_of")), 1)
    limit = (_positive(payload.get("max_completion_tokens"))
             or _positive(payload.get("max_tokens")) or _positive(default_output))
    return UsageLimits(output=limit * choices if limit else None, context=context,
                       choices=choices)


def bounds(split: PromptSplit, limits: UsageLimits) -> tuple[int, int]:
    """(the largest prompt, the largest output) believed for this request."""
    # images, audio, files: the gateway's count of them is a guess, the window bounds them
    prompt = CEILING if split.non_text_parts else split.total * PROMPT_FACTOR + PROMPT_SLACK
    output = CEILING if limits.output is None else limits.output
    if limits.context is not None:
        prompt = min(prompt, limits.context)
        output = min(output, limits.context * limits.choices)
    return min(prompt, CEILING), min(output, CEILING)


def check(usage: BackendUsage, split: PromptSplit, limits: UsageLimits) -> str | None:
    """The reason ``usage`` (read without a problem, or with ``usage.rejected``) cannot be
    billed for this request, or None. A cache or reasoning figure above the total it is part of
    was cut to it when read (``usage.overstated`` keeps the largest such figure): cut, it
    cannot raise the bill, so only one beyond both bounds is refused."""
    if usage.rejected is not None:
        return usage.rejected
    prompt, output = bounds(split, limits)
    if usage.prompt_tokens > prompt:
        return f"{TOO_LARGE}:prompt_tokens"
    if usage.completion_tokens > output:
        return f"{TOO_LARGE}:completion_tokens"
    if usage.total_tokens > prompt + output:
        return f"{TOO_LARGE}:total_tokens"
    if usage.overstated > max(prompt, output):
        return f"{TOO_LARGE}:details"
    return None


def screen(split: PromptSplit, usage: BackendUsage | None, limits: UsageLimits | None
           ) -> tuple[BackendUsage | None, str | None]:
    """(the usage to bill, None when the gateway must estimate; why it estimates, or None)."""
    if usage is None:
        return None, NO_USAGE
    reason = check(usage, split, limits or UsageLimits())
    return (usage, None) if reason is None else (None, reason)
