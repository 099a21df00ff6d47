"""What a closed-loop run sends: :class:`Workload` and the request factory it builds.

Bodies are pre-built: the JSON is rendered once with a placeholder, split around it, and each
request only joins ``head + number + tail``. The number at the start of the prompt keeps every
request distinct, so an engine's prefix cache does not turn the run into a cache benchmark
(``unique=False`` sends one identical body).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from loadtest.client import RequestSpec, Target, build_body, synth_prompt

__all__ = ["SpecFactory", "Workload", "spec_factory"]

SpecFactory = Callable[[int], RequestSpec]
_MARK = "\u0001REQ\u0001"


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One request shape: prompt (text or synthetic length), output length, class."""

    prompt_tokens: int = 1000
    prompt: str | None = None
    max_tokens: int = 256
    ignore_eos: bool = False
    klass: str = "interactive"
    unique: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spec_factory(target: Target, workload: Workload) -> SpecFactory:
    """A function ``i -> RequestSpec`` for request number ``i`` of a run."""
    text = workload.prompt or synth_prompt(workload.prompt_tokens, "#0")
    if workload.unique:
        text = _MARK + " " + text.removeprefix("#0 ")
    body = build_body(
        target.model,
        [{"role": "user", "content": text}],
        workload.max_tokens,
        ignore_eos=workload.ignore_eos,
    )
    extra = {"X-Request-Class": workload.klass} if workload.klass != "interactive" else None
    headers = target.headers(extra)
    url = target.chat_url
    head, sep, tail = body.partition(_MARK.encode("utf-8"))
    if not sep:  # placeholder escaped by the encoder
        head, sep, tail = body.partition(b"\\u0001REQ\\u0001")

    if not sep:

        def same(i: int) -> RequestSpec:
            return RequestSpec(
                url=url,
                headers=headers,
                body=body,
                max_tokens=workload.max_tokens,
                klass=workload.klass,
            )

        return same

    def make(i: int) -> RequestSpec:
        return RequestSpec(
            url=url,
            headers=headers,
            body=b"".join((head, b"#", str(i).encode(), tail)),
            max_tokens=workload.max_tokens,
            klass=workload.klass,
        )

    return make
