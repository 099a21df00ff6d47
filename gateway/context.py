"""The per-request context that every stage fills in.

Created per request and not shared between requests. Stages write the facts they learn (key,
model, pool, backend, timings, outcome); later stages and the access record read them, never
reaching back into an earlier stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.accounting import TokenUsage

__all__ = ["RequestContext"]


@dataclass(slots=True)
class RequestContext:
    """What is known about one request as it moves through the pipeline."""

    request_id: str  # the gateway's own: the key of the reservation and the usage record
    endpoint: str
    started_ns: int = field(default_factory=time.perf_counter_ns)
    key_id: str | None = None
    tenant: str | None = None
    request_model: str | None = None  # gen_ai.request.model (the public name)
    upstream_model: str | None = None  # the name sent to the backend
    stream: bool = False
    request_class: str | None = None
    version: str | None = None  # the rollout version chosen, if the model has versions
    pool: str | None = None
    backend: str | None = None
    attempts: int = 0
    failovers: int = 0  # moves to a fallback pool
    retry_budget_exhausted: bool = False
    status: int = 0
    response_started: bool = False  # the status line went out: no error answer possible now
    first_token_ns: int | None = None  # first body byte relayed to the client
    output_chunks: int = 0
    last_chunk_ns: int | None = None
    finished_ns: int | None = None
    outcome: str = "pending"  # completed | failed | cancelled | rejected
    error: str | None = None
    usage: TokenUsage | None = None  # filled by accounting once the response is over
    quota: str | None = None  # admitted | rejected:<limit> | unavailable (None: no limits)
    admitted: bool = False  # passed admission: one usage record will be written
    batch_id: str | None = None  # set for the lines of a batch job (tags the usage record)
    client_request_id: str | None = None  # the client's correlation id, never used as a key

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_ns is None:
            return None
        return (self.first_token_ns - self.started_ns) / 1e6

    @property
    def duration_ms(self) -> float | None:
        if self.finished_ns is None:
            return None
        return (self.finished_ns - self.started_ns) / 1e6
