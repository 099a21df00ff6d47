"""The request pipeline: every stage of one request, in order, for live requests and batch
lines alike.

    authenticate -> parse and classify -> admit -> route -> shadow -> forward and relay
    -> meter -> record

Read :meth:`Pipeline.run` top to bottom to follow a request from the HTTP edge to the ledger.
Each stage is one call into the package that owns its rules, with typed inputs and outputs:

=================  ============================================================================
authenticate       ``auth``: the key -> :class:`~gateway.auth.resolver.Identity` (or a 401)
parse, classify    ``dialects.chat.parse`` (the body), ``dialects.responses.store`` (a Responses request
                   to be stored by a tenant at its ``stored_responses`` bound: a 400; the
                   conversation a ``previous_response_id`` continues), ``dialects.limits`` (the
                   output limit against the model's ``max_output_tokens``: a 400),
                   ``routing.classes`` (the class; a 400 for an unknown ``X-Request-Class``)
admit              ``quota.admit``: the estimate, the reservation, the 429, ``x-ratelimit-*``
route              ``routing.router``: version (canary weight, stickiness), pools, affinity
shadow             ``upstream.shadow``: mirror an admitted request, never billed
forward, relay     ``upstream.forward`` (attempts; retries only before the first byte) and
                   ``upstream.relay`` (the answer, chunk by chunk, bounded by the deadline)
meter              ``accounting.meter``: tokens by kind (system, history, new, tools, cached,
                   output) and cost
record             ``ledger.record``: the one usage record of an admitted request
=================  ============================================================================

Whatever fails after admission still reaches meter and record (``finally``): every admitted
request leaves exactly one usage record and settles its reservation once. The HTTP edge
(``api/``) only reads the request line and headers, hands over a way to read the body, and
watches for a client that leaves; batch lines enter through :meth:`Pipeline.run_line`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting import StreamScanner, request_usage
from gateway.accounting.meter import count_prompt, meter, meter_failed
from gateway.accounting.split import PromptSplit
from gateway.accounting.tokens import account
from gateway.accounting.usage_bounds import rejection_kind, request_limits
from gateway.config.model import StoredResponseLimits
from gateway.context import RequestContext, client_request_id, new_request_id
from gateway.dialects.chat.parse import ENDPOINTS, parse_request
from gateway.dialects.limits import check_output_limit
from gateway.dialects.plan import CHAT_PATH, Upstream, plan_upstream, refuse_untranslatable
from gateway.dialects.registry import (
    decode_native,
    frontend_for,
    send_api_error,
    translate_native,
)
from gateway.dialects.responses.store import continued, keeper, room
from gateway.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    ServerShuttingDown,
    UsageNotRecorded,
)
from gateway.http.asgi import ClientGone, clip, header_value, send_error
from gateway.ledger import make_record
from gateway.quota.admit import Admitted, admit
from gateway.routing.classes import UnknownClass, resolve_class
from gateway.routing.conversation import SESSION_HEADER
from gateway.upstream.cache_isolation import isolate_body
from gateway.upstream.continuation import Continuer
from gateway.upstream.forward import forward, release
from gateway.upstream.outbound import outbound_headers
from gateway.upstream.relay import relay_response
from gateway.upstream.rename import AnswerRewriter, RenamingScanner

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from gateway.accounting import PromptCounter, Scanner, TokenUsage
    from gateway.accounting.usage import Shape
    from gateway.auth.resolver import Identity
    from gateway.config import Model
    from gateway.dialects.base import Frontend
    from gateway.dialects.chat.parse import Endpoint, ParsedRequest
    from gateway.http.base import UpstreamClient
    from gateway.ledger import Ledger, UsageRecord
    from gateway.ledger.sql.stored_responses import ResponseStore
    from gateway.quota import QuotaStore
    from gateway.runtime import Runtime
    from gateway.telemetry import Metrics, RequestSpan, RequestTracing
    from gateway.types import Message, RawHeaders, Send
    from gateway.upstream.forward import Forwarded
    from gateway.upstream.shadow import Mirror, Pairing

__all__ = ["Inbound", "LineAnswer", "Pipeline", "Services"]

_encoder = msgspec.json.Encoder()
_log = logging.getLogger("gateway.pipeline")
#: the stored-responses bound of a tenant outside the policy's tenants
_DEFAULT_STORED_BOUND = StoredResponseLimits()


@dataclass(frozen=True, slots=True, kw_only=True)
class Services:
    """The long-lived services a request uses, built once by the app and never reassigned.

    ``current`` gives the policy snapshot a request starts with (a reload swaps it; a request
    in flight keeps its own); ``draining`` says whether the process is shutting down.
    """

    current: Callable[[], Runtime]
    draining: Callable[[], bool]
    upstream: UpstreamClient
    quota: QuotaStore
    ledger: Ledger
    tracing: RequestTracing
    metrics: Metrics
    mirror: Mirror
    counter: Callable[[str], PromptCounter]
    finished: Callable[[RequestContext, RequestSpan], None]
    settle_later: Callable[[Coroutine[Any, Any, None]], None]
    #: stored responses (Responses API ``store``, ``previous_response_id``); None: none kept
    responses: ResponseStore | None = None
    #: progressive rollouts count each finished request of a versioned model
    rollouts: Callable[[RequestContext], None] | None = None


class Inbound:
    """One request as the pipeline takes it.

    The pipeline calls three methods: :meth:`read_body` reads the body (after authentication:
    an unauthenticated client never makes the gateway read it), :meth:`on_body_read` lets the
    edge start watching for a client that leaves, and :meth:`client_gone` tells a cancellation
    by that watch from a shutdown. Built with callables for them (a batch line, a test); the
    HTTP edge subclasses it and overrides the three methods instead, so a live request builds
    no closures. A batch line sets ``identity``, ``request_class``, ``request_id`` and
    ``batch_id``. A plain slotted class, not a frozen dataclass: one is built per request, and a
    frozen dataclass's ``__init__`` costs several times as much.
    """

    __slots__ = ("_client_gone", "_on_body_read", "_read_body", "batch_id", "endpoint",
                 "headers", "identity", "method", "request_class", "request_id")

    def __init__(
        self,
        *,
        method: str,
        endpoint: Endpoint,
        headers: RawHeaders,
        read_body: Callable[[int], Awaitable[bytes]],
        on_body_read: Callable[[RequestContext], None] | None = None,
        client_gone: Callable[[], bool] | None = None,
        identity: Identity | None = None,
        request_class: str | None = None,
        request_id: str | None = None,
        batch_id: str | None = None,
    ) -> None:
        self.method, self.endpoint, self.headers = method, endpoint, headers
        self._read_body, self._on_body_read = read_body, on_body_read
        self._client_gone = client_gone
        self.identity, self.request_class = identity, request_class
        self.request_id, self.batch_id = request_id, batch_id

    def read_body(self, limit: int) -> Awaitable[bytes]:
        """The body, at most ``limit`` bytes (a larger one is the edge's 413)."""
        return self._read_body(limit)

    def on_body_read(self, ctx: RequestContext) -> None:
        """The body is read and parsed: the request now runs until it is answered."""
        if self._on_body_read is not None:
            self._on_body_read(ctx)

    def client_gone(self) -> bool:
        """Whether the client left (the cause of a cancellation, if one came)."""
        return self._client_gone is not None and self._client_gone()


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """A batch line's answer: the status and the whole body the client would have read."""

    status: int
    body: bytes


class Pipeline:
    """Runs requests through the stages; one per process, shared by every request."""

    def __init__(self, services: Services) -> None:
        self.services = services
        #: requests of this process between their headers and their usage record
        self.active = 0

    async def run(self, inbound: Inbound, send: Send) -> None:
        """One request, from its headers to its usage record; answers through ``send``."""
        services = self.services
        runtime = services.current()  # this request's policy snapshot, whatever reloads
        ctx = _context(inbound)
        answer: RawHeaders = [(b"x-request-id", ctx.request_id.encode())]
        if ctx.client_request_id is not None:
            answer.append((b"x-client-request-id", ctx.client_request_id.encode()))
        span = services.tracing.start(inbound.headers, ctx)
        parsed: ParsedRequest | None = None
        frontend = frontend_for(inbound.endpoint.api)  # None: a chat-shaped API
        self.active += 1
        try:
            if inbound.method != "POST":
                raise MethodNotAllowed(
                    f"method {inbound.method} is not allowed on {inbound.endpoint.path}; "
                    "use POST", headers={"Allow": "POST"})
            if services.draining():
                raise ServerShuttingDown("the gateway is shutting down; retry on another replica")
            # 1. authenticate
            identity = await _authenticate(runtime, inbound, ctx)
            # 2. parse and classify
            body = await inbound.read_body(runtime.policy.server.max_body_bytes)
            if frontend is None:
                parsed = parse_request(body, inbound.endpoint)
            else:  # Responses, Messages: checked in their shape, carried as chat
                native = decode_native(body)
                # a request to be stored by a tenant at its stored-responses bound: a 400
                await room(services.responses, frontend, ctx.tenant or "", native,
                           _stored_bound(runtime, ctx.tenant), len(body))
                earlier = await continued(services.responses, frontend, ctx.tenant or "",
                                          native)  # a stored conversation it continues
                parsed, _ = translate_native(native, frontend, earlier)
            inbound.on_body_read(ctx)
            model = _model(runtime, parsed)
            ctx.request_model, ctx.stream = parsed.model, parsed.stream
            # the output limit, in the client's own field, against the model's ceiling:
            # before admission, so an over-limit request reserves and forwards nothing
            check_output_limit(model, parsed, frontend)
            # what chat cannot carry, when no pool could take it as sent: 400 before admission
            refuse_untranslatable(parsed, frontend, runtime.router.pools)
            ctx.request_class = _classify(runtime, inbound, identity, ctx, parsed)
            await self._serve(runtime, inbound, identity, ctx, model, parsed, body, send,
                              answer, span)
        except GatewayError as exc:
            if ctx.outcome == "pending":
                ctx.outcome = "failed" if ctx.admitted else "rejected"
            ctx.status, ctx.error = exc.status, exc.message
            if not ctx.response_started:
                await _send_error(send, frontend, exc, answer)
        except ClientGone:
            ctx.outcome = "cancelled"
        except asyncio.CancelledError:
            if not inbound.client_gone():
                raise  # server shutdown past the drain timeout: let it cancel
            ctx.outcome = "cancelled"
        except Exception:  # a bug: answer a plain 500, never a traceback to the client
            _log.exception("unexpected error in request %s", ctx.request_id)
            ctx.outcome, ctx.status = "failed", 500
            if not ctx.response_started:
                await _send_error(send, frontend, InternalError("internal gateway error"),
                                  answer)
        finally:
            self.active -= 1
            self._finish(runtime, ctx, parsed, span)

    async def _serve(
        self,
        runtime: Runtime,
        inbound: Inbound,
        identity: Identity | None,
        ctx: RequestContext,
        model: Model,
        parsed: ParsedRequest,
        raw: bytes,
        send: Send,
        answer: RawHeaders,
        span: RequestSpan,
    ) -> None:
        """Admit, route, shadow, forward and relay, meter; settle on every path."""
        size = len(raw)
        services = self.services
        endpoint = inbound.endpoint
        counter = services.counter(model.encoding)
        price = runtime.prices.lookup(model.name, ctx.tenant)
        # what the backend's usage may be for this request (``accounting.usage_bounds``)
        limits = request_limits(parsed.payload, endpoint.operation,
                                default_output=model.max_output_tokens)
        # 3. admit: every limit checked and reserved in one round trip
        admitted: Admitted | None = None
        scopes = runtime.scopes(ctx.tenant, ctx.key_id, identity.limits if identity else None,
                                model.name)
        if scopes:
            admitted = await admit(
                services.quota, ctx, scopes, model=model.name, output=_output(model, parsed),
                counter=counter, operation=endpoint.operation, payload=parsed.payload,
                size=size, price=price, on_refused=services.metrics.quota_rejected)
            answer += admitted.headers
        ctx.admitted = True  # from here on the request leaves exactly one usage record
        forwarded: Forwarded | None = None
        shadowed: Pairing | None = None  # a mirrored request's comparison, fed the answer
        metered: bytes | None = None
        try:
            # 4. route
            router = runtime.router
            session = header_value(inbound.headers, SESSION_HEADER)
            # the tenant's prompt-cache salt: the prefix index and the engines keep tenants
            # apart by it (``upstream/cache_isolation.py``)
            salt = runtime.cache_salts.salt(ctx.tenant)
            route = router.route_request(
                model, ctx.request_class or "", ctx.key_id, parsed.payload, session,
                salt if runtime.cache_mode(model.pool) != "shared" else None)
            route.tenant, route.weight = ctx.tenant or "", _weight(runtime, ctx.tenant)
            route.prompt_tokens = _route_tokens(admitted, size)
            route.tokens = route.prompt_tokens + _output(model, parsed)
            ctx.version, ctx.upstream_model = route.version, route.upstream_model
            path, frontend = endpoint.path, frontend_for(endpoint.api)
            shape: Shape = "openai"
            plan: Upstream | None = None
            scanner: Scanner | None
            rewriter: AnswerRewriter | None = None  # the public name, the gateway's id
            if frontend is None:
                body, scanner, rewriter = _upstream_body(parsed, raw, route.upstream_model,
                                                         endpoint.api, ctx.request_id)
            else:  # passed through to a pool that speaks the API, or translated to chat
                plan = plan_upstream(
                    frontend, parsed, route.pool, route.upstream_model, ctx.request_id,
                    lambda: _prompt_tokens(admitted, counter, parsed))
                path, body, scanner, shape = plan.path, plan.body, plan.scanner, plan.shape
                answer += plan.headers  # x-gateway-ignored: what a translation dropped
            body = isolate_body(body, runtime.cache_mode(route.pool.name), salt)
            keep = None if frontend is None else keeper(
                services.responses, frontend, parsed, plan, ctx.tenant or "",
                runtime.policy.store.responses_ttl_hours)  # a stored response's save
            headers = span.propagate(outbound_headers(inbound.headers, ctx))
            # 5. shadow (admitted requests only: a 429 is never mirrored)
            if model.shadow is not None:
                shadowed = services.mirror.start(
                    router, model.shadow, CHAT_PATH if frontend else path, parsed.payload,
                    headers, ctx, _record_content(runtime, ctx),
                    lambda pool, mirrored: isolate_body(mirrored, runtime.cache_mode(pool), salt))
                if shadowed is not None and scanner is not None:
                    scanner = shadowed.tap(scanner)
            # 6. forward (retries before the first byte) and relay
            answer.append((b"x-gateway-class", (ctx.request_class or "").encode()))
            forwarded = await forward(router, services.upstream, route, ctx, path,
                                      body, headers, runtime.timeouts[ctx.request_class or ""],
                                      span, services.metrics)
            answer.append((b"x-gateway-pool", forwarded.pool.name.encode()))
            metered = forwarded.body  # the backend's own answer, in its usage ``shape``
            if forwarded.body is not None:
                if plan is not None:  # the client's API
                    forwarded.body = plan.answer(forwarded.response.status, forwarded.body)
                elif rewriter is not None and forwarded.response.status < 400:
                    forwarded.body = rewriter.whole(forwarded.body)

            async def finish() -> None:
                """7-8 before the response's last bytes: meter, then the durable record (and
                a stored response, saved beside it)."""
                ctx.usage = await meter(
                    counter, endpoint.operation, parsed.payload, size,
                    admitted.split if admitted is not None else None,
                    body=metered, scanner=scanner, price=price,
                    batch=ctx.request_class == "batch", shape=shape, limits=limits)
                if ctx.status >= 400:  # an error answer: no output was delivered
                    ctx.usage = await meter_failed(
                        counter, endpoint.operation, parsed.payload, size,
                        admitted.split if admitted is not None else None, ctx.usage,
                        price=price, batch=ctx.request_class == "batch",
                        bill_failed=runtime.prices.bill_failed)
                if keep is not None and ctx.outcome == "completed" and ctx.status < 400:
                    # the save is queued for its commit now and waited for after the record
                    # (both may wait for a commit, side by side): no task of its own, where
                    # gather made two (7.6 us a stored response against 0.1)
                    saved = keep(forwarded.body)
                    try:
                        made.append(await self._record(runtime, ctx))
                    except BaseException:
                        saved.close()  # the queued row still commits; nobody waits for it
                        raise
                    await saved
                else:
                    made.append(await self._record(runtime, ctx))

            made: list[UsageRecord] = []  # the record ``finish`` made, for ``_undelivered``

            def progress(chunks: int) -> None:
                """A stream's provisional record: what a killed process leaves billed."""
                split = admitted.split if admitted is not None else None
                usage = account(split or PromptSplit(),
                                None, estimated_output=chunks, price=price,
                                batch=ctx.request_class == "batch", reason="interrupted")
                record = msgspec.structs.replace(
                    self._make_record(runtime, ctx, usage), outcome="interrupted",
                    delivered=None, sent_output=chunks)
                if services.ledger.provisional(record):
                    if ctx.provisional is None:
                        ctx.provisional = []
                    ctx.provisional.append(record)

            keeps = _keeps_provisional(runtime, services.ledger)
            # a stream broken after its first byte may go on on another backend
            continuer = _continuer(forwarded, scanner, plan, endpoint.api, rewriter,
                                   router=router, upstream=services.upstream, route=route,
                                   ctx=ctx, path=path, body=body, headers=headers,
                                   timeouts=runtime.timeouts[ctx.request_class or ""],
                                   count_text=counter.count_text,
                                   prompt_tokens=lambda: _prompt_tokens(admitted, counter,
                                                                        parsed),
                                   span=span, metrics=services.metrics)
            try:
                await relay_response(forwarded, ctx, send, answer, scanner, finish,
                                     services.metrics, progress if keeps else None,
                                     continuer.resume if continuer is not None else None)
            finally:
                current = continuer.forwarded if continuer is not None else forwarded
                if current is not None:  # a continuation's failed ones are released
                    release(current, ctx)
                if made and ctx.provisional:  # the final record stands for them once stored
                    services.ledger.supersede(made[0], ctx.provisional)
                if made and not ctx.delivered:  # its last bytes did not reach the client
                    self._undelivered(ctx, made[0])
                # the engine's own name for the model, for the trace (the client saw the public)
                ctx.response_model = (plan.backend_model if plan is not None
                                      else rewriter.backend_model if rewriter is not None
                                      else None)
                if ctx.usage is None:  # 7. meter (a response that did not reach its end)
                    ctx.usage = await meter(
                        counter, endpoint.operation, parsed.payload, size,
                        admitted.split if admitted is not None else None,
                        body=metered, scanner=scanner, price=price,
                        batch=ctx.request_class == "batch", shape=shape, limits=limits)
        finally:
            if not ctx.recorded and (forwarded is None or ctx.first_token_ns is None):
                # failed before any output: tokens counted, cost 0 unless prices.bill_failed
                ctx.usage = await meter_failed(
                    counter, endpoint.operation, parsed.payload, size,
                    admitted.split if admitted is not None else None, ctx.usage,
                    price=price, batch=ctx.request_class == "batch",
                    bill_failed=runtime.prices.bill_failed)
            if admitted is not None:  # settled in the background: the answer is complete
                services.settle_later(admitted.admission.settle(*_actual(ctx.usage)))
            _count_rejected_usage(services.metrics, ctx)
            if shadowed is not None:  # the primary's side of the comparison (read later)
                shadowed.primary(ctx, forwarded, scanner, metered)

    def _finish(self, runtime: Runtime, ctx: RequestContext, parsed: ParsedRequest | None,
                span: RequestSpan) -> None:
        """The request's telemetry and, if it was admitted, its one usage record."""
        if ctx.finished_ns is None:
            ctx.finished_ns = time.perf_counter_ns()
        span.end(ctx, payload=parsed.payload if parsed is not None else None,
                 response_model=ctx.response_model, record_content=_record_content(runtime, ctx))
        services = self.services
        services.finished(ctx, span)  # metrics and access line, in batches
        if ctx.version is not None and services.rollouts is not None:
            services.rollouts(ctx)  # a canary's gates read it
        # 8. record (here only for a request that did not reach its response's end)
        if ctx.admitted and not ctx.recorded:
            record = self._make_record(runtime, ctx)
            services.ledger.write_nowait(record)
            if ctx.provisional:
                services.ledger.supersede(record, ctx.provisional)

    def _make_record(self, runtime: Runtime, ctx: RequestContext,
                     usage: TokenUsage | None = None) -> UsageRecord:
        tenant = ctx.tenant or "default"
        team, organization = runtime.placement(tenant)
        return make_record(ctx, usage or ctx.usage, tenant=tenant, team=team,
                           organization=organization,
                           batch_id=ctx.batch_id, currency=runtime.prices.currency,
                           api=_API.get(ctx.endpoint, "chat"))

    async def _record(self, runtime: Runtime, ctx: RequestContext) -> UsageRecord:
        """8. record: the usage record of a request whose response is about to end, durable
        when this returns as ``store.ledger_durability`` says (``commit``: in the database;
        ``journal``: fsync'd to the local journal; ``process``: written there). Raises
        ``UsageNotRecorded`` past ``store.ledger_timeout``, the record then corrected to the
        refusal the client gets."""
        ctx.recorded = True
        record = self._make_record(runtime, ctx)
        store = runtime.policy.store
        ledger = self.services.ledger
        mode = ledger.auto_mode if store.ledger_durability == "auto" else store.ledger_durability
        if mode == "commit":
            durable = ledger.write_durable(record)
        elif mode == "journal":  # alone: nothing to overlap the fsync with
            durable = ledger.write_journaled(record, alone=self.active <= 1)
        elif mode == "process":
            written = ledger.write_process(record)
            if written is None:
                return record
            durable = written
        else:
            ledger.write_nowait(record)
            return record
        if not durable.done():
            try:
                await _durable_within(durable, store.ledger_timeout)
            except UsageNotRecorded as exc:  # the answer is withheld: so says its record
                ledger.amend(record, outcome="failed", status=exc.status, delivered=False,
                             sent_output=0, **_unbilled(runtime, record))
                raise
        return record

    def _undelivered(self, ctx: RequestContext, record: UsageRecord) -> None:
        """The response's last bytes did not reach the client after its record was made: the
        record is corrected while it still waits in this process (``Ledger.amend``); one
        already stored keeps its presumption (``delivered`` true)."""
        sent = record.sent_output if ctx.stream else 0
        self.services.ledger.amend(record, delivered=False, sent_output=sent)

    async def run_line(self, inbound: Inbound) -> LineAnswer:
        """A batch line, exactly like a live request of its key: quotas, routing, retries,
        accounting and the usage record all apply; the answer is collected whole."""
        status = 0
        chunks: list[bytes] = []

        async def collect(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.run(inbound, collect)
        return LineAnswer(status, b"".join(chunks))


# --- the steps' small pieces ------------------------------------------------------------------
#: the client API of each proxied path, for the usage record
_API = {path: endpoint.api for path, endpoint in ENDPOINTS.items()}



def _keeps_provisional(runtime: Runtime, ledger: Ledger) -> bool:
    """Whether a stream writes provisional records: not with ``buffered`` durability (its
    final record may itself be lost to a killed process), nor without a file to keep them."""
    return ledger.inflight is not None and runtime.policy.store.ledger_durability != "buffered"


def _unbilled(runtime: Runtime, record: UsageRecord) -> dict[str, int]:
    """The cost fields of a record whose answer the client never got: zero, unless the
    policy bills failed requests (``prices.bill_failed``)."""
    if runtime.prices.bill_failed:
        return {}
    return dict.fromkeys(("cost_micros", "cost_system", "cost_history", "cost_new",
                          "cost_tools", "cost_output", "cost_reasoning", "cost_cached",
                          "cost_cache_write"), 0)


async def _durable_within(durable: asyncio.Future[None], timeout: float) -> None:
    """Wait for a record to be durable, at most ``timeout`` seconds (the ledger spools within
    that bound when its database does not answer, so a timeout here means it could not make
    the record durable at all: a full disk). The record stays queued and is retried."""
    try:
        async with asyncio.timeout(timeout):
            await asyncio.shield(durable)
    except TimeoutError:
        raise UsageNotRecorded(
            f"the usage record of this answer could not be made durable within "
            f"{timeout:g} s (store.ledger_timeout), so the answer is withheld; retry, "
            "possibly on another replica") from None


def _record_content(runtime: Runtime, ctx: RequestContext) -> bool:
    """Whether the tenant's policy lets its prompt and answer text be kept (traces, shadow
    examples); off for a tenant the policy does not name."""
    tenant = runtime.tenants.get(ctx.tenant or "")
    return tenant.record_content if tenant else False


async def _send_error(send: Send, frontend: Frontend | None, error: GatewayError,
                      headers: RawHeaders) -> None:
    """An error answer in the client's API: OpenAI's shape, or the front-end's."""
    if frontend is None:
        await send_error(send, error, headers)
    else:
        await send_api_error(send, frontend, error, headers)



def _context(inbound: Inbound) -> RequestContext:
    """A request's context under the gateway's own id (a batch line brings one the gateway
    made); the client's id is kept for correlation only."""
    if inbound.request_id is not None:
        ctx = RequestContext(inbound.request_id, inbound.endpoint.path)
        ctx.batch_id, ctx.request_class = inbound.batch_id, inbound.request_class
        return ctx
    ctx = RequestContext(new_request_id(), inbound.endpoint.path)
    ctx.client_request_id = client_request_id(inbound.headers)
    return ctx


async def _authenticate(runtime: Runtime, inbound: Inbound, ctx: RequestContext
                        ) -> Identity | None:
    identity = inbound.identity  # a batch line: authenticated when the batch was created
    if identity is None:
        header = header_value(inbound.headers, b"authorization")
        if header is None and inbound.endpoint.api == "messages":  # Anthropic's own header
            key = header_value(inbound.headers, b"x-api-key")
            header = b"Bearer " + key if key is not None else None
        identity = await runtime.resolver.authenticate(header)
    if identity is None:  # keys are not required by this policy
        ctx.tenant = "anonymous"
        return None
    ctx.key_id, ctx.tenant = identity.key_id, identity.tenant
    return identity


def _model(runtime: Runtime, parsed: ParsedRequest) -> Model:
    model = runtime.models.get(parsed.model)
    if model is None:
        raise ModelNotFound(
            f"The model '{clip(parsed.model)}' does not exist or you do not have access to it.",
            param="model")
    return model


def _classify(runtime: Runtime, inbound: Inbound, identity: Identity | None,
              ctx: RequestContext, parsed: ParsedRequest) -> str:
    if ctx.request_class is not None:  # a batch line
        return ctx.request_class
    header = header_value(inbound.headers, b"x-request-class")
    tenant = runtime.tenants.get(ctx.tenant or "")
    try:
        return resolve_class(
            runtime.policy.routing, runtime.router.classes,
            header.decode("latin-1") if header else None,
            identity is not None and identity.allow_class_header,
            identity.default_class if identity else None,
            tenant.default_class if tenant else None,
            parsed.model, inbound.endpoint.path, parsed.payload, parsed.stream,
        )
    except UnknownClass as exc:
        raise InvalidRequest(str(exc), param="x-request-class") from exc


def _output(model: Model, parsed: ParsedRequest) -> int:
    """The most output the request may produce: its limit, or the model's default."""
    limit = parsed.payload.get("max_completion_tokens") or parsed.payload.get("max_tokens")
    return limit if isinstance(limit, int) and limit >= 0 else model.default_max_tokens


def _stored_bound(runtime: Runtime, tenant: str | None) -> StoredResponseLimits:
    """The tenant's bound on stored responses: its own, else its plan's, else the defaults."""
    t = runtime.tenants.get(tenant or "")
    if t is None:
        return _DEFAULT_STORED_BOUND
    if t.stored_responses is not None:
        return t.stored_responses
    plan = runtime.plans.get(t.plan)
    return plan.stored_responses if plan is not None else _DEFAULT_STORED_BOUND


def _weight(runtime: Runtime, tenant: str | None) -> float:
    """The tenant's fair-queuing weight: its own, else its plan's, else 1."""
    t = runtime.tenants.get(tenant or "")
    if t is None:
        return 1.0
    if t.weight is not None:
        return t.weight
    plan = runtime.plans.get(t.plan)
    return plan.weight if plan is not None else 1.0


def _upstream_body(parsed: ParsedRequest, body: bytes, upstream_model: str, api: str,
                   request_id: str
                   ) -> tuple[bytes, StreamScanner | None, AnswerRewriter]:
    """The body for the backend (its model name; streams always ask for usage, which the
    scanner strips if the client did not ask), the stream's scanner (None: not a stream), and
    the rewriter that gives the answer (whole, or through the scanner) the public model name,
    whatever the engine calls its model, and the gateway's id."""
    wants_usage = request_usage(parsed.payload, parsed.stream)
    if upstream_model != parsed.model or not wants_usage:
        parsed.payload["model"] = upstream_model
        body = _encoder.encode(parsed.payload)
    prefix = _ID_PREFIXES.get(api)
    rewriter = AnswerRewriter(parsed.model, prefix + request_id if prefix is not None else None,
                              upstream_model)
    scanner = (RenamingScanner(rewriter, strip_usage=not wants_usage) if parsed.stream
               else None)
    return body, scanner, rewriter


def _continuer(forwarded: Forwarded, scanner: Scanner | None, plan: Upstream | None, api: str,
               rewriter: AnswerRewriter | None, **args: Any) -> Continuer | None:
    """The stream's continuation on another backend, when its pool's ``continuation`` is on
    and the stream is chat going upstream (a chat stream, or one translated to chat)."""
    settings = forwarded.pool.config.continuation
    if (not settings.enabled or scanner is None or forwarded.first_chunk is None
            or (api != "chat" if plan is None else plan.native)):
        return None
    fresh = rewriter.fresh if rewriter is not None else lambda: AnswerRewriter(None)
    return Continuer(settings, forwarded, scanner=scanner, rewriter=fresh, **args)


#: the id prefix of each API's answers (OpenAI's); embeddings answers carry no id
_ID_PREFIXES = {"chat": "chatcmpl-", "completions": "cmpl-"}


def _prompt_tokens(admitted: Admitted | None, counter: PromptCounter, parsed: ParsedRequest
                   ) -> int:
    """The prompt's tokens as admission counted them (or counted now, without limits)."""
    split = admitted.split if admitted is not None else None
    return (split or count_prompt(counter, "chat", parsed.payload)).total


def _route_tokens(admitted: Admitted | None, size: int) -> int:
    """The prompt's tokens for routing (prefill prediction, the tenant's fair share):
    admission's count when it counted, else the body's bytes / 4 (about a token per four
    bytes of text; routing predicts and shares, it does not bill, so the prompt is not
    tokenised for this alone)."""
    split = admitted.split if admitted is not None else None
    return split.total if split is not None else size // 4


def _count_rejected_usage(metrics: Metrics, ctx: RequestContext) -> None:
    """A backend's usage that was not believed (its record holds the estimate) is counted per
    backend and kind (``gateway_backend_usage_rejected_total``)."""
    kind = rejection_kind(ctx.usage.estimate_reason) if ctx.usage is not None else None
    if kind is not None:
        metrics.usage_rejected(ctx.pool or "", ctx.backend or "", kind)


def _actual(usage: TokenUsage | None) -> tuple[int | None, int]:
    """What a settle charges: the real tokens and cost (None: never reached a backend)."""
    if usage is None:
        return None, 0
    return usage.prompt_total + usage.output, usage.cost.total if usage.cost is not None else 0
