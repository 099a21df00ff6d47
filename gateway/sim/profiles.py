"""Engine profiles: the calibrated constants of the step-cost model (see SIMULATOR.md).

A profile is the hardware plus scheduler limits of one replica. The two defaults share the
Llama-3.1-8B / 1xH100 cost constants and differ only in batch size, step budget and queue, so at
light load they answer identically and under load the interactive one caps TPOT by queueing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["PROFILES", "Profile", "get_profile"]


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Scheduler limits and step-cost constants of one simulated replica.

    ``step_ms = a + c*n_dec + d*ctx_dec/1000 + sum over chunks [k/R + q*((s+k)^2 - s^2)]``.
    """

    name: str
    #: S: most sequences in the running batch (vLLM ``max_num_seqs``).
    max_running: int
    #: T: tokens computed per step, decodes first then prompt chunks (``max_num_batched_tokens``).
    step_tokens: int
    #: K: KV-cache capacity in tokens, allocated in blocks of ``block_tokens``.
    kv_tokens: int
    #: Longest waiting queue; a request beyond it is rejected at once.
    queue_limit: int
    block_tokens: int = 16
    #: a: weight read and kernel launch per step (memory bound).
    step_ms: float = 6.5
    #: c: cost per decoding sequence.
    per_seq_ms: float = 0.03
    #: d: KV read per 1,000 context tokens of the decoding sequences.
    per_kctx_ms: float = 0.05
    #: R: prefill throughput, tokens per millisecond (compute bound).
    prefill_tokens_per_ms: float = 40.0
    #: q: attention's quadratic term per (position^2).
    attn_quadratic_ms: float = 5e-7
    #: e: HTTP, tokenisation and scheduling overhead before a request can be scheduled.
    request_overhead_ms: float = 8.0

    @property
    def max_model_len(self) -> int:
        """The most prompt plus output tokens one request may hold (vLLM's ``max_model_len``):
        the KV cache's whole blocks, so that the engine's admission check agrees."""
        return self.kv_tokens // self.block_tokens * self.block_tokens

    def step_cost_ms(self, n_dec: int, ctx_dec: int, prefill_ms: float) -> float:
        """Duration of one step given its decodes and the summed cost of its prompt chunks."""
        return (
            self.step_ms + self.per_seq_ms * n_dec + self.per_kctx_ms * ctx_dec / 1000 + prefill_ms
        )

    def chunk_cost_ms(self, start: int, tokens: int) -> float:
        """Cost of computing ``tokens`` prompt tokens from position ``start``."""
        end = start + tokens
        return tokens / self.prefill_tokens_per_ms + self.attn_quadratic_ms * (
            end * end - start * start
        )


PROFILES: dict[str, Profile] = {
    "interactive": Profile(
        name="interactive", max_running=32, step_tokens=2048, kv_tokens=450_000, queue_limit=256
    ),
    "batch": Profile(
        name="batch", max_running=256, step_tokens=8192, kv_tokens=450_000, queue_limit=4096
    ),
    # llama.cpp's llama-server on loadtest.engines.tiny_model's default model (embedding 256,
    # 4 layers, GPT-2's 50,257-token vocabulary, f16) at -t 1, one CPU core: the engine's CPU
    # time fitted by `python -m loadtest.bench.engine_shape` (docs/benchmarks/llamacpp.md).
    # Unlike a GPU, the core is compute bound per sequence (the 50,257 x 256 output matrix and
    # sampling over the vocabulary): a step costs ~1.4 ms per decoding sequence over a 0.65 ms
    # base, so batching barely raises throughput, and prefill is ~0.1 ms a token (quadratic
    # beyond ~1,000 tokens). S is llama-server's -np (set with --slots), T its -b, K its -c.
    "tiny-llamacpp": Profile(
        name="tiny-llamacpp", max_running=16, step_tokens=2048, kv_tokens=32_768,
        queue_limit=4096, step_ms=0.65, per_seq_ms=1.4, per_kctx_ms=1.2,
        prefill_tokens_per_ms=9.5, attn_quadratic_ms=5e-5, request_overhead_ms=6.5,
    ),
}


def get_profile(name: str | Profile, **overrides: Any) -> Profile:
    """A named (or given) profile with some fields replaced; ``None`` overrides are ignored.

    Unknown names raise ``ValueError`` so a typo in a flag or a test fails loudly.
    """
    if isinstance(name, Profile):
        base = name
    else:
        try:
            base = PROFILES[name]
        except KeyError:
            raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
    fields = {f.name for f in dataclasses.fields(Profile)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown profile fields: {', '.join(sorted(unknown))}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(base, **changes) if changes else base
