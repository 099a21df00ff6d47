"""The per-request context that every stage fills in.

Created per request and not shared between requests. Stages write the facts they learn (key,
model, pool, backend, timings, outcome); later stages and the access record read them, never
reaching back into an earlier stage.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.accounting import TokenUsage
    from gateway.types import RawHeaders

__all__ = ["RequestContext", "client_request_id", "new_request_id"]

_CLIENT_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")


def new_request_id() -> str:
    """The gateway's id for a request: 128 random bits as 32 hex digits.

    A request is admitted, reserved and billed under it (the idempotency key of its quota
    reservation and of its usage record), so it is never one a client chose: ten requests
    sharing a client's id would otherwise share one reservation and one record. The ids a
    client sees (``x-request-id``, ``chatcmpl-``, ``resp_``, ``msg_``) are built on it, and a
    stored response is found by it, so it is unguessable too: a counter, even behind a random
    prefix, would tell a client the ids of the requests sent just before and after its own.
    ``os.urandom`` costs about a microsecond (one ``getrandom`` call).
    """
    return os.urandom(16).hex()


def client_request_id(headers: RawHeaders) -> str | None:
    """The client's own correlation id (``x-client-request-id``, else ``x-request-id``), if
    well-formed; kept for the access line, the trace and the backend, never used as a key."""
    supplied: bytes | None = None
    for name, value in headers:
        if name == b"x-client-request-id":
            supplied = value
            break
        if name == b"x-request-id" and supplied is None:
            supplied = value
    if supplied is not None and _CLIENT_ID.match(supplied):
        return supplied.decode("ascii")
    return None


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
    #: the name the engine answered with (gen_ai.response.model; the client saw the public)
    response_model: str | None = None
    stream: bool = False
    request_class: str | None = None
    version: str | None = None  # the rollout version chosen, if the model has versions
    pool: str | None = None
    backend: str | None = None
    attempts: int = 0
    failovers: int = 0  # moves to a fallback pool
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
    recorded: bool = False  # its usage record was written (before the response's end)
    #: the whole answer was handed to the client's connection (its last bytes included);
    #: False once a send failed or the answer was cut or withheld
    delivered: bool = False
    #: a stream's provisional records written so far (``Ledger.provisional``), let go once
    #: its final record is stored
    provisional: list[Any] | None = None
    #: a stream broken after its first byte went on on another backend (``continuation``)
    continued: bool = False
    #: the continuations' prompt tokens (the prompt plus the text already sent, each time)
    continuation_prompt: int = 0
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
