"""Step 1 of the validation path: one request with a fixed prompt, checked (:func:`run_probe`).

Checks, each PASS or FAIL: the request succeeded; the text is non-empty; it is valid UTF-8 with no
U+FFFD replacement characters (a sign of bytes split or garbled on the way); the stream ended with
a ``finish_reason``; the output token count is the ``max_tokens`` asked for (from usage when the
server sends it, else content chunks; only when ``exact_tokens``); the speed, output tokens over
the whole request time, clears ``min_tps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest.client import Client, RequestSpec, Result, Target, build_body

__all__ = ["DEFAULT_PROMPT", "Check", "ProbeResult", "check_result", "run_probe"]

DEFAULT_PROMPT = (
    "Explain in three short paragraphs why the sky is blue during the day and red at sunset."
)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(slots=True, kw_only=True)
class ProbeResult:
    """The measured figures of one request and the checks made on them."""

    target: dict[str, str]
    max_tokens: int
    ttft_ms: float | None
    e2e_ms: float | None
    output_tokens: int
    tokens_per_s: float
    decode_tokens_per_s: float | None
    finish_reason: str | None
    text: str
    error: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "probe",
            "target": self.target,
            "max_tokens": self.max_tokens,
            "ttft_ms": self.ttft_ms,
            "e2e_ms": self.e2e_ms,
            "output_tokens": self.output_tokens,
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "finish_reason": self.finish_reason,
            "text": self.text,
            "error": self.error,
            "passed": self.passed,
            "checks": [
                {"name": c.name, "passed": c.passed, "detail": c.detail} for c in self.checks
            ],
        }


def check_result(
    res: Result, max_tokens: int, min_tps: float, *, exact_tokens: bool = True
) -> list[Check]:
    """The probe's checks on one result (pure: no I/O)."""
    text = res.text or ""
    e2e = res.e2e_s or 0.0
    tps = res.output_tokens / e2e if e2e > 0 else 0.0
    source = "usage" if res.completion_tokens is not None else "content chunks"
    checks = [
        Check("request succeeded", res.ok, f"{res.error}: {res.detail}" if res.error else "200"),
        Check("text non-empty", bool(text.strip()), f"{len(text)} characters"),
        Check(
            "valid UTF-8, no U+FFFD",
            res.error != "bad_utf8" and "\ufffd" not in text,
            f"{text.count(chr(0xFFFD))} replacement characters",
        ),
        Check("finish_reason present", bool(res.finish_reason), str(res.finish_reason)),
    ]
    if exact_tokens:
        checks.append(
            Check(
                "output tokens as asked",
                res.output_tokens == max_tokens,
                f"{res.output_tokens} of {max_tokens} (from {source})",
            )
        )
    checks.append(Check(f"speed >= {min_tps:g} tok/s", tps >= min_tps, f"{tps:.1f} tok/s"))
    return checks


async def run_probe(
    target: Target,
    *,
    prompt: str = DEFAULT_PROMPT,
    max_tokens: int = 256,
    min_tps: float = 50.0,
    ignore_eos: bool = False,
    exact_tokens: bool = True,
    timeout: float = 120.0,
) -> ProbeResult:
    """Send the probe request and check it."""
    body = build_body(
        target.model, [{"role": "user", "content": prompt}], max_tokens, ignore_eos=ignore_eos
    )
    spec = RequestSpec(
        url=target.chat_url, headers=target.headers(), body=body, max_tokens=max_tokens
    )
    async with Client(1, timeout=timeout) as client:
        res = await client.send(spec, keep_text=True)
    e2e = res.e2e_s or 0.0
    tpot = res.tpot_s
    return ProbeResult(
        target={"url": target.url, "model": target.model},
        max_tokens=max_tokens,
        ttft_ms=res.ttft_s * 1e3 if res.ttft_s is not None else None,
        e2e_ms=e2e * 1e3 if res.end_ns else None,
        output_tokens=res.output_tokens,
        tokens_per_s=res.output_tokens / e2e if e2e > 0 else 0.0,
        decode_tokens_per_s=1.0 / tpot if tpot else None,
        finish_reason=res.finish_reason,
        text=res.text or "",
        error=res.error and f"{res.error}: {res.detail}",
        checks=check_result(res, max_tokens, min_tps, exact_tokens=exact_tokens),
    )
