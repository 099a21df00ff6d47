"""Plain stand-ins for the request context and usage that telemetry reads."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FakeContext", "FakeCost", "FakeUsage", "finished"]

MS = 1_000_000


@dataclass
class FakeContext:
    request_id: str = "req-1"
    client_request_id: str | None = None
    endpoint: str = "/v1/chat/completions"
    started_ns: int = 1_000_000_000_000
    key_id: str | None = "key-1"
    request_model: str | None = "chat-model"
    upstream_model: str | None = "chat-model-v2"
    stream: bool = True
    request_class: str | None = "interactive"
    version: str | None = None
    pool: str | None = "gpu-a"
    backend: str | None = "b1"
    attempts: int = 1
    failovers: int = 0
    status: int = 200
    first_token_ns: int | None = None
    last_chunk_ns: int | None = None
    output_chunks: int = 0
    finished_ns: int | None = None
    outcome: str = "completed"
    error: str | None = None


@dataclass(frozen=True)
class FakeCost:
    total: int = 0


@dataclass(frozen=True)
class FakeUsage:
    system: int = 10
    history: int = 20
    new: int = 5
    tools: int = 0
    cached: int = 8
    output: int = 31
    prompt_total: int = 35
    estimated: bool = False
    cost: FakeCost | None = field(default_factory=lambda: FakeCost(2_500_000))


def finished(ttft_ms: int = 200, tpot_ms: int = 20, output: int = 31, **kw: object) -> FakeContext:
    """A streamed request that finished: first token after ``ttft_ms``, then ``output - 1``
    tokens ``tpot_ms`` apart."""
    ctx = FakeContext(**kw)  # type: ignore[arg-type]
    ctx.first_token_ns = ctx.started_ns + ttft_ms * MS
    ctx.last_chunk_ns = ctx.first_token_ns + (output - 1) * tpot_ms * MS
    ctx.finished_ns = ctx.last_chunk_ns + MS
    return ctx
