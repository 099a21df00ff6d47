"""Integer apportionment: scale counted parts so they sum exactly to the backend's figure.

The gateway's own counts are estimates (tool rendering, images, chat templates of other models);
the backend's ``prompt_tokens`` is what is billed. Each part gets its share of the backend total
by the largest-remainder (Hamilton) method: the floor of its exact quota, then the tokens left
over go one each to the parts with the largest remainders, ties to the earlier part. So parts are
never negative, each is within one token of its exact quota, they sum exactly to the total, and the
result depends only on the inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.accounting.split import PromptSplit

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["apportion", "fit_split"]


def apportion(total: int, weights: Sequence[int], *, fallback: int = 0) -> list[int]:
    """Split ``total`` into integers proportional to ``weights``.

    With all weights zero, the whole total goes to ``weights[fallback]``.
    """
    if total < 0:
        raise ValueError(f"total must not be negative, got {total}")
    if any(w < 0 for w in weights):
        raise ValueError(f"weights must not be negative, got {list(weights)}")
    whole = sum(weights)
    if whole == 0:
        parts = [0] * len(weights)
        parts[fallback] = total
        return parts
    scaled = [w * total for w in weights]
    parts = [s // whole for s in scaled]
    left = total - sum(parts)
    if left:
        order = sorted(range(len(weights)), key=lambda i: (-(scaled[i] % whole), i))
        for i in order[:left]:
            parts[i] += 1
    return parts


def fit_split(split: PromptSplit, prompt_tokens: int) -> PromptSplit:
    """The split scaled to sum to the backend's ``prompt_tokens`` (a count of 0 goes to ``new``).

    Ties go to the earlier part in the order system, history, new, tools.
    """
    if split.total == prompt_tokens:
        return split
    system, history, new, tools = apportion(
        prompt_tokens, (split.system, split.history, split.new, split.tools), fallback=2
    )
    return PromptSplit(
        system=system,
        history=history,
        new=new,
        tools=tools,
        non_text_parts=split.non_text_parts,
    )
