"""The proxied OpenAI routes, as raw ASGI handlers: authenticate, parse, route, forward, relay.

One instance per endpoint, shared by all requests; per-request state lives in the
:class:`~gateway.context.RequestContext`. A watcher on ``receive`` notices a client that leaves
and cancels the request at once, which aborts the upstream connection so the backend frees its
slot.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from gateway.accounting import (
    PromptSplit,
    StreamScanner,
    TokenUsage,
    account_body,
    account_stream,
    price_usage,
    request_usage,
)
from gateway.accounting.offload import OFFLOAD_BYTES, off_loop
from gateway.api.asgi import ClientGone, clip, get_header, read_body, send_error
from gateway.api.parse import parse_request
from gateway.api.ratelimit import ratelimit_headers
from gateway.api.relay import relay_response
from gateway.api.rename import ModelRenamer, RenamingScanner
from gateway.api.shadow import start_shadow
from gateway.batch.runner import LineAnswer
from gateway.context import RequestContext
from gateway.deadlines import wheel
from gateway.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    QuotaStoreUnavailable,
    RateLimited,
    ServerShuttingDown,
)
from gateway.ledger import make_record
from gateway.quota import QuotaRequest, QuotaUnavailable
from gateway.quota.admission import Admission
from gateway.routing.classes import UnknownClass, resolve_class
from gateway.routing.conversation import SESSION_HEADER, conversation_key
from gateway.upstream.forward import forward
from gateway.upstream.headers import request_headers

if TYPE_CHECKING:
    from gateway.api.parse import Endpoint, ParsedRequest
    from gateway.auth.resolver import Identity
    from gateway.batch.runner import LineCall
    from gateway.config import Model
    from gateway.quota import Scope as QuotaScope
    from gateway.quota.base import Decision
    from gateway.routing.router import Router
    from gateway.runtime import Gateway, Runtime
    from gateway.telemetry import RequestSpan
    from gateway.types import Message, RawHeaders, Receive, Scope, Send
    from gateway.upstream.forward import Forwarded

__all__ = [
    "INTERNAL",
    "InternalCall",
    "ProxyHandler",
    "call_internal",
    "client_request_id",
    "new_request_id",
    "request_id_for",
]

#: limits that count tokens (or cost): refusals a smaller, exact estimate might pass
_TOKEN_LIMITS = frozenset({"tpm", "tokens_per_day", "tokens_per_month"})

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")
_encoder = msgspec.json.Encoder()
_log = logging.getLogger("gateway.proxy")

# Request ids: a random per-process prefix and a counter. Unique across processes with
# overwhelming probability, and ~20x cheaper than uuid4 (no syscall per request).
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(int.from_bytes(os.urandom(4), "big"))

#: how long a request runs before a disconnect watcher is attached. Requests that finish sooner
#: (most non-streaming ones against a fast backend) never pay for the watcher's task; a client
#: that leaves is noticed within this delay at worst.
WATCH_AFTER_S = 0.02


def new_request_id() -> str:
    """A gateway-made request id: 32 hex digits, unique across processes."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def request_id_for(scope: Scope) -> str:
    """The id of a request: always the gateway's own, whatever the client sent.

    A request is admitted, reserved and billed under this id (the idempotency key of its quota
    reservation and of its usage record), so a client must never choose it: ten requests
    sharing a client's id would share one reservation and one record.
    """
    return new_request_id()


def client_request_id(scope: Scope) -> bytes | None:
    """The client's own correlation id (``x-client-request-id``, else ``x-request-id``), if
    well-formed; kept for the access line, the trace and the backend, never used as a key."""
    supplied = get_header(scope, b"x-client-request-id") or get_header(scope, b"x-request-id")
    if supplied is not None and _REQUEST_ID.match(supplied):
        return supplied
    return None


class _Watch:
    """Cancels the request's task when the client disconnects, until :meth:`stop`.

    Attached lazily (after :data:`WATCH_AFTER_S`): it needs a task of its own on ``receive()``.
    """

    __slots__ = ("_ctx", "_future", "_receive", "_task", "_timer", "_wheel", "active",
                 "client_gone")

    def __init__(
        self, receive: Receive, loop: asyncio.AbstractEventLoop, ctx: RequestContext
    ) -> None:
        self._ctx = ctx
        task = asyncio.current_task(loop)
        assert task is not None
        self._task = task
        self._receive = receive
        self.active = True
        self.client_gone = False
        self._future: asyncio.Task[Message] | None = None
        self._wheel = wheel(loop)
        self._timer = self._wheel.add(WATCH_AFTER_S, lambda: self._attach(loop))

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.active:
            self._future = loop.create_task(self._receive())  # type: ignore[arg-type]
            self._future.add_done_callback(self._on_message)

    def _on_message(self, future: asyncio.Future[Message]) -> None:
        if not self.active or future.cancelled() or future.exception() is not None:
            return
        if self._ctx.finished_ns is not None:  # the response is complete: nothing to cancel
            return
        if future.result().get("type") == "http.disconnect":
            self.client_gone = True
            self._task.cancel()

    def stop(self) -> None:
        self.active = False
        self._wheel.cancel(self._timer)
        if self._future is not None:
            self._future.cancel()


class ProxyHandler:
    """ASGI handler for one OpenAI endpoint."""

    def __init__(self, gateway: Gateway, endpoint: Endpoint) -> None:
        self.gateway = gateway
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        internal: InternalCall | None = scope.get(INTERNAL)
        if internal is not None:  # a batch line (see call_internal): its id is the gateway's
            ctx = RequestContext(internal.request_id, self.endpoint.path)
            ctx.batch_id, ctx.request_class = internal.batch_id, internal.request_class
            client_id = None
        else:
            ctx = RequestContext(new_request_id(), self.endpoint.path)
            client_id = client_request_id(scope)
        id_header: RawHeaders = [(b"x-request-id", ctx.request_id.encode())]
        if client_id is not None:
            ctx.client_request_id = client_id.decode("ascii")
            id_header.append((b"x-client-request-id", client_id))
        watch: _Watch | None = None
        gateway = self.gateway
        runtime = gateway.runtime  # this request's policy snapshot, whatever reloads happen
        span = gateway.tracing.start(scope["headers"], ctx)
        parsed: ParsedRequest | None = None
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(
                    f"method {scope['method']} is not allowed on {self.endpoint.path}; use POST",
                    headers={"Allow": "POST"},
                )
            if self.gateway.draining:
                raise ServerShuttingDown("the gateway is shutting down; retry on another replica")
            identity = await self._authenticate(runtime, scope, ctx, internal)
            body = await read_body(scope, receive, runtime.policy.server.max_body_bytes)
            parsed = parse_request(body, self.endpoint)
            watch = _Watch(receive, asyncio.get_running_loop(), ctx)
            await self._proxy(runtime, identity, scope, ctx, parsed, body, send, id_header, span)
        except GatewayError as exc:
            if ctx.outcome == "pending":
                ctx.outcome = "failed" if ctx.admitted else "rejected"
            ctx.status, ctx.error = exc.status, exc.message
            if not ctx.response_started:
                await send_error(send, exc, id_header)
        except ClientGone:
            ctx.outcome = "cancelled"
        except asyncio.CancelledError:
            if watch is None or not watch.client_gone:
                raise  # server shutdown past the drain timeout: let it cancel
            ctx.outcome = "cancelled"
        except Exception:  # a bug: answer a plain 500, never a traceback to the client
            _log.exception("unexpected error in request %s", ctx.request_id)
            ctx.outcome, ctx.status = "failed", 500
            if not ctx.response_started:
                await send_error(send, InternalError("internal gateway error"), id_header)
        finally:
            if watch is not None:
                watch.stop()
            self._record(runtime, ctx, parsed, span)

    def _record(
        self, runtime: Runtime, ctx: RequestContext, parsed: ParsedRequest | None,
        span: RequestSpan,
    ) -> None:
        """The request's telemetry and, if it was admitted, its one usage record."""
        if ctx.finished_ns is None:
            ctx.finished_ns = time.perf_counter_ns()
        gateway = self.gateway
        tenant = runtime.tenants.get(ctx.tenant or "")
        span.end(ctx, payload=parsed.payload if parsed is not None else None,
                 record_content=tenant.record_content if tenant else False)
        gateway.finished(ctx, span)  # metrics and access line, in batches
        if ctx.admitted:
            gateway.ledger.write_nowait(make_record(
                ctx, ctx.usage, tenant=ctx.tenant or "default",
                batch_id=ctx.batch_id, currency=runtime.prices.currency,
            ))

    async def _authenticate(
        self, runtime: Runtime, scope: Scope, ctx: RequestContext,
        internal: InternalCall | None = None,
    ) -> Identity | None:
        if internal is not None:  # authenticated when the batch was created
            ctx.key_id, ctx.tenant = internal.identity.key_id, internal.identity.tenant
            return internal.identity
        identity = await runtime.resolver.authenticate(get_header(scope, b"authorization"))
        if identity is None:  # keys are not required by this policy
            ctx.tenant = "anonymous"
            return None
        ctx.key_id, ctx.tenant = identity.key_id, identity.tenant
        return identity

    async def _proxy(
        self,
        runtime: Runtime,
        identity: Identity | None,
        scope: Scope,
        ctx: RequestContext,
        parsed: ParsedRequest,
        body: bytes,
        send: Send,
        extra: RawHeaders,
        span: RequestSpan,
    ) -> None:
        """Classify, admit, route, shadow, forward (with retries), relay; release the backend
        and settle the reservation on every path."""
        model = runtime.models.get(parsed.model)
        if model is None:
            raise ModelNotFound(
                f"The model '{clip(parsed.model)}' does not exist or you do not have access "
                "to it.",
                param="model",
            )
        ctx.request_model = parsed.model
        ctx.stream = parsed.stream
        header = get_header(scope, b"x-request-class")
        router = runtime.router
        tenant = runtime.tenants.get(ctx.tenant or "")
        try:
            class_name = ctx.request_class or resolve_class(
                runtime.policy.routing, router.classes,
                header.decode("latin-1") if header else None,
                identity is not None and identity.allow_class_header,
                identity.default_class if identity else None,
                tenant.default_class if tenant else None,
                parsed.model, self.endpoint.path, parsed.payload, parsed.stream,
            )
        except UnknownClass as exc:
            raise InvalidRequest(str(exc), param="x-request-class") from exc
        ctx.request_class = class_name
        split: PromptSplit | None = None
        admission: Admission | None = None
        scopes = runtime.scopes(ctx.tenant, ctx.key_id, identity.limits if identity else None,
                                model.name)
        if scopes:  # admit: check and reserve every limit in one round trip
            admission = Admission(self.gateway.quota)
            split = await self._admit(runtime, admission, ctx, model, parsed, len(body), scopes,
                                      extra)
        ctx.admitted = True  # from here on the request leaves exactly one usage record
        forwarded: Forwarded | None = None
        try:
            conversation = conversation_key(parsed.payload, get_header(scope, SESSION_HEADER))
            route = router.route(model, class_name, _sticky_key(model, ctx, conversation),
                                 conversation if _wants_affinity(router, model) else None)
            ctx.version = route.version
            ctx.upstream_model = route.upstream_model
            # streams always ask the backend for usage; the scanner strips it if the client
            # didn't ask for it
            client_wants_usage = request_usage(parsed.payload, parsed.stream)
            if route.upstream_model != parsed.model or not client_wants_usage:
                parsed.payload["model"] = route.upstream_model
                body = _encoder.encode(parsed.payload)
            renamer = (ModelRenamer(route.upstream_model, parsed.model)
                       if route.upstream_model != parsed.model else None)
            scanner: StreamScanner | None = None
            if parsed.stream:
                scanner = (StreamScanner(strip_usage=not client_wants_usage) if renamer is None
                           else RenamingScanner(renamer, strip_usage=not client_wants_usage))
            headers = request_headers(scope["headers"])
            headers += (
                (b"content-type", b"application/json"),
                (b"accept-encoding", b"identity"),
                (b"x-request-id", ctx.request_id.encode()),
            )
            if ctx.client_request_id is not None and get_header(
                scope, b"x-client-request-id"
            ) is None:
                headers.append((b"x-client-request-id", ctx.client_request_id.encode()))
            headers = span.propagate(headers)
            if model.shadow is not None:  # admitted requests only: a 429 is never mirrored
                start_shadow(self.gateway, runtime, model.shadow, self.endpoint.path, parsed,
                             headers)
            extra.append((b"x-gateway-class", class_name.encode()))
            forwarded = await forward(router, self.gateway.upstream, route, ctx,
                                      self.endpoint.path, body, headers,
                                      runtime.timeouts[class_name], span, self.gateway.metrics)
            extra.append((b"x-gateway-pool", forwarded.pool.name.encode()))
            if renamer is not None and forwarded.body is not None:
                forwarded.body = renamer.whole(forwarded.body)
            try:
                await relay_response(forwarded, ctx, send, extra, scanner)
            finally:
                forwarded.response.close()
                _settle_backend(forwarded, ctx)
                forwarded.pool.release(forwarded.backend)
                ctx.usage = await self._account(runtime, ctx, model, parsed, len(body),
                                                forwarded, scanner, split)
        finally:
            if admission is not None:
                usage = ctx.usage
                tokens = None if usage is None else usage.prompt_total + usage.output
                spent = usage.cost.total if usage is not None and usage.cost is not None else 0
                # the response is complete: settle in the background (it survives a
                # cancelled request; shutdown waits for it)
                self.gateway.settle_later(admission.settle(tokens, spent))

    async def _admit(
        self,
        runtime: Runtime,
        admission: Admission,
        ctx: RequestContext,
        model: Model,
        parsed: ParsedRequest,
        size: int,
        scopes: tuple[QuotaScope, ...],
        extra: RawHeaders,
    ) -> PromptSplit | None:
        """Reserve every limit, or raise the 429; returns the prompt's split if it was counted.

        A small body is counted exactly first (on the loop: at most ``OFFLOAD_BYTES``). A large
        one is first reserved with a bound that needs no tokenizer (every token is at least one
        byte of the body), so a key at its limit is refused before any counting; only when
        that bound is refused by a token limit is the prompt counted, off the loop, and the
        reservation tried with the exact figure. A large request admitted on the bound holds
        that bound until its settle, which charges the real tokens. The ``x-ratelimit-*``
        figures go on the answer either way (``extra`` when admitted, the 429's headers).
        """
        limit = parsed.payload.get("max_completion_tokens") or parsed.payload.get("max_tokens")
        out = limit if isinstance(limit, int) and limit >= 0 else model.default_max_tokens
        split: PromptSplit | None = None
        if size <= OFFLOAD_BYTES:
            split = self._count(model, parsed)
            decision = await self._reserve(runtime, admission, ctx, model, scopes, split, out)
        else:
            bound = PromptSplit(new=size)
            decision = await self._reserve(runtime, admission, ctx, model, scopes, bound, out)
            if not decision.admitted and decision.limit in _TOKEN_LIMITS:
                split = await off_loop(lambda: self._count(model, parsed))
                decision = await self._reserve(runtime, admission, ctx, model, scopes, split,
                                               out)
        limits = ratelimit_headers(decision.ratelimit) if decision.ratelimit else []
        if not decision.admitted:
            name = str(decision.limit)
            if (decision.scope or "").startswith("cost"):  # spend budgets count cost
                name = name.replace("tokens_", "cost_")
            ctx.quota = f"rejected:{name}"
            self.gateway.metrics.quota_rejected(name, ctx.tenant)
            wait = max(1, math.ceil(decision.retry_after))
            raise RateLimited(
                f"Rate limit reached: {name} of {decision.scope} for tenant "
                f"'{ctx.tenant}'. Retry after {wait}s.",
                headers={"Retry-After": str(wait),
                         **{k.decode(): v.decode() for k, v in limits}},
            )
        extra += limits
        ctx.quota = "admitted"
        return split

    async def _reserve(
        self,
        runtime: Runtime,
        admission: Admission,
        ctx: RequestContext,
        model: Model,
        scopes: tuple[QuotaScope, ...],
        split: PromptSplit,
        out: int,
    ) -> Decision:
        """One reserve for an estimate of ``split`` + ``out`` tokens, priced from this
        request's own policy snapshot."""
        cost = 0
        if any(s.unit == "cost" for s in scopes):  # spend budgets: the most this can cost
            price = runtime.prices.lookup(model.name, ctx.tenant)
            if price is not None:
                cost = price_usage(
                    price, system=split.system, history=split.history, new=split.new,
                    tools=split.tools, cached=0, output=out,
                    batch=ctx.request_class == "batch",
                ).total
        request = QuotaRequest(
            request_id=ctx.request_id, tenant=ctx.tenant or "default", scopes=scopes,
            estimated_tokens=split.total + out, key_id=ctx.key_id, model=model.name,
            estimated_cost=cost,
        )
        try:
            return await admission.reserve(request)
        except QuotaUnavailable as exc:
            ctx.quota = "unavailable"
            raise QuotaStoreUnavailable(
                "quota store unavailable; retry shortly", headers={"Retry-After": "1"}
            ) from exc

    def _count(self, model: Model, parsed: ParsedRequest) -> PromptSplit:
        counter = self.gateway.counter(model.encoding)
        operation = self.endpoint.operation
        if operation == "chat":
            return counter.count_chat(parsed.payload)
        if operation == "embeddings":
            return counter.count_embedding(parsed.payload)
        return counter.count_completion(parsed.payload)

    async def _account(
        self,
        runtime: Runtime,
        ctx: RequestContext,
        model: Model,
        parsed: ParsedRequest,
        size: int,
        forwarded: Forwarded,
        scanner: StreamScanner | None,
        split: PromptSplit | None,
    ) -> TokenUsage:
        """Tokens by kind and their cost, after the response (off the latency path).

        Large work (a large prompt not counted yet, a large body, a stream whose backend
        reported no usage and whose delivered text must be tokenised) runs on the counting
        thread, so the loop never stalls on it.
        """
        counter = self.gateway.counter(model.encoding)
        remember = self.endpoint.operation == "chat"
        price = runtime.prices.lookup(model.name, ctx.tenant)
        batch = ctx.request_class == "batch"

        def count() -> TokenUsage:
            prompt = split or self._count(model, parsed)
            if scanner is not None:
                return account_stream(prompt, scanner, counter, price=price, batch=batch,
                                      remember_reply=remember)
            return account_body(prompt, forwarded.body or b"", counter, price=price,
                                batch=batch, remember_reply=remember)

        large = (
            (split is None and size > OFFLOAD_BYTES)
            or (scanner is not None and scanner.usage is None)
            or len(forwarded.body or b"") > OFFLOAD_BYTES
        )
        return await off_loop(count) if large else count()


# --- internal calls (batch lines) ------------------------------------------------------------
#: scope key of an internal call; only in-process code can set it (never a client)
INTERNAL = "gateway.internal"


@dataclass(frozen=True, slots=True)
class InternalCall:
    """Who an internal request runs as, its class, and the batch it belongs to."""

    identity: Identity
    request_class: str
    request_id: str
    batch_id: str | None = None


async def call_internal(handler: ProxyHandler, line: LineCall) -> LineAnswer:
    """Run one batch line through ``handler`` exactly like a live request of its key.

    A synthetic ASGI exchange: the scope carries the identity and the batch id (class
    ``batch``) and the line's request id; ``receive`` yields the body and then never reports
    a disconnect; ``send`` collects the answer. Quotas, routing, retries, accounting and the
    usage record all apply as for a client's request.
    """
    scope: dict[str, object] = {
        "type": "http", "method": "POST", "path": line.endpoint,
        "headers": [(b"content-length", str(len(line.body)).encode())],
        INTERNAL: InternalCall(line.identity, "batch", line.request_id, line.batch_id),
    }
    sent = False
    never: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": line.body, "more_body": False}
        return await asyncio.shield(never)  # cancelled with its waiter, never resolved

    status = 0
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await handler(scope, receive, send)
    return LineAnswer(status, b"".join(chunks))


# ---------------------------------------------------------------------------------------------
def _settle_backend(forwarded: Forwarded, ctx: RequestContext) -> None:
    """Feed the outcome to the backend's health and latency averages."""
    backend = forwarded.backend
    if ctx.outcome == "completed":
        backend.on_success()
    elif ctx.outcome == "failed":
        backend.on_failure(forwarded.pool.config.health, time.monotonic())
    if forwarded.first_chunk_ns is not None:
        ttft = (forwarded.first_chunk_ns - forwarded.sent_ns) / 1e9
        tpot = None
        if ctx.output_chunks > 1 and ctx.last_chunk_ns is not None:
            tpot = (ctx.last_chunk_ns - forwarded.first_chunk_ns) / 1e9 / (ctx.output_chunks - 1)
        backend.observe(ttft, tpot)
        forwarded.pool.observe_ttft(ttft)


def _wants_affinity(router: Router, model: Model) -> bool:
    return router.pools[model.pool].config.affinity is not None or any(
        router.pools[p].config.affinity is not None for p in model.pools.values()
    )


def _sticky_key(model: Model, ctx: RequestContext, conversation: bytes | None) -> bytes | None:
    """What keeps a caller on one version of a model: its key, or its conversation."""
    if model.sticky == "key":
        return (ctx.key_id or "").encode()
    if model.sticky == "conversation":
        return conversation
    return None
