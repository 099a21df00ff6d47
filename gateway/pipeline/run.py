"""``Pipeline``: the stages of one request in order (``run``, then ``_serve`` from admission on);
the package's docstring lists each stage and the package that owns it."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.accounting.meter import RequestMeter
from gateway.accounting.usage_bounds import rejection_kind, request_limits
from gateway.config.model import StoredResponseLimits
from gateway.context import RequestContext, client_request_id, new_request_id
from gateway.dialects.dialect import DIALECTS, Conversation
from gateway.dialects.shape import ENDPOINTS
from gateway.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    ServerShuttingDown,
    UsageNotRecorded,
)
from gateway.http.asgi import ClientGone, clip, header_value
from gateway.ledger import make_record
from gateway.pipeline.closing import Closing, Exchange
from gateway.pipeline.inbound import Inbound, LineAnswer, Services
from gateway.quota.admit import Admitted, admit
from gateway.routing.classes import UnknownClass, resolve_class
from gateway.routing.conversation import SESSION_HEADER
from gateway.upstream.cache_isolation import isolate_body
from gateway.upstream.continuation import Continuer
from gateway.upstream.forward import forward, release
from gateway.upstream.outbound import outbound_headers
from gateway.upstream.relay import relay_response
from gateway.upstream.rename import AnswerRewriter

if TYPE_CHECKING:

    from gateway.accounting import Scanner, TokenUsage
    from gateway.auth.resolver import Identity
    from gateway.config import Model
    from gateway.dialects.plan import Upstream
    from gateway.dialects.shape import Endpoint, ParsedRequest
    from gateway.ledger import UsageRecord
    from gateway.routing.router import Route
    from gateway.runtime import Runtime
    from gateway.telemetry import Metrics, RequestSpan
    from gateway.types import Message, RawHeaders, Send
    from gateway.upstream.forward import Forwarded
    from gateway.upstream.shadow import Pairing

__all__ = ["Pipeline"]


_log = logging.getLogger("gateway.pipeline")
#: the stored-responses bound of a tenant outside the policy's tenants
_DEFAULT_STORED_BOUND = StoredResponseLimits()


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
        dialect = DIALECTS[inbound.endpoint.api]
        self.active += 1
        try:
            if inbound.method != "POST":
                raise MethodNotAllowed(
                    f"method {inbound.method} is not allowed on {inbound.endpoint.path}; "
                    "use POST", headers={"Allow": "POST"})
            if services.draining():
                raise ServerShuttingDown("the gateway is shutting down; retry on another replica")
            # 1. authenticate
            identity = await _authenticate(runtime, inbound, ctx, dialect.key_header)
            # 2. parse and classify
            raw = await inbound.read_body(runtime.policy.server.max_body_bytes)
            conversation = Conversation(services.responses, ctx.tenant or "",
                                        _stored_bound(runtime, ctx.tenant),
                                        runtime.policy.store.responses_ttl_hours)
            parsed = await dialect.parse(raw, inbound.endpoint, conversation)
            inbound.on_body_read(ctx)
            model = _model(runtime, parsed)
            ctx.request_model, ctx.stream = parsed.model, parsed.stream
            # refused here, before admission, a request reserves and forwards nothing
            dialect.check(model, parsed, runtime.router.pools)
            ctx.request_class = _classify(runtime, inbound, identity, ctx, parsed)
            await self._serve(Exchange(
                runtime, inbound, identity, ctx, dialect, conversation, parsed, model, raw,
                _meter(services, runtime, inbound.endpoint, ctx, model, parsed, len(raw)),
                send, answer, span))
        except GatewayError as exc:
            if ctx.outcome == "pending":
                ctx.outcome = "failed" if ctx.admitted else "rejected"
            ctx.status, ctx.error = exc.status, exc.message
            if not ctx.response_started:
                await dialect.send_error(send, exc, answer)
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
                await dialect.send_error(send, InternalError("internal gateway error"), answer)
        finally:
            self.active -= 1
            self._finish(runtime, ctx, parsed, span)

    async def _serve(self, x: Exchange) -> None:
        """3-8: admit, route, shadow, forward and relay, meter and record; settled on every
        path. Meter and record run inside the relay, before the last bytes (``Closing``)."""
        services, runtime, ctx, meter = self.services, x.runtime, x.ctx, x.meter
        # 3. admit: every limit checked and reserved in one round trip
        admitted = await self._admit(x)
        ctx.admitted = True  # from here on the request leaves exactly one usage record
        forwarded: Forwarded | None = None
        shadowed: Pairing | None = None  # a mirrored request's comparison, fed the answer
        scanner: Scanner | None = None
        try:
            # 4. route, then the dialect's plan for the pool: pass through or translate
            route, salt = _route(x)
            plan = x.dialect.plan(x.parsed, x.raw, route.pool, route.upstream_model,
                                  ctx.request_id, meter.prompt_tokens)
            x.answer += plan.headers  # x-gateway-ignored: what a translation dropped
            body = isolate_body(plan.body, runtime.cache_mode(route.pool.name), salt)
            headers = x.span.propagate(outbound_headers(x.inbound.headers, ctx))
            scanner = plan.scanner
            # 5. shadow (admitted requests only: a 429 is never mirrored)
            shadowed = self._shadow(x, headers, salt)
            if shadowed is not None and scanner is not None:
                scanner = shadowed.tap(scanner)
            # 6. forward (retries before the first byte) and relay
            x.answer.append((b"x-gateway-class", (ctx.request_class or "").encode()))
            timeouts = runtime.timeouts[ctx.request_class or ""]
            forwarded = await forward(runtime.router, services.upstream, route, ctx, plan.path,
                                      body, headers, timeouts, x.span, services.metrics)
            x.answer.append((b"x-gateway-pool", forwarded.pool.name.encode()))
            meter.read(forwarded.body, scanner, plan.shape)  # the backend's own answer
            if forwarded.body is not None:  # the client's body, in its API
                forwarded.body = plan.answer(forwarded.response.status, forwarded.body)
            closing = Closing(self, x, forwarded, x.dialect.saver(x.parsed, plan,
                                                                   x.conversation))
            # a stream broken after its first byte may go on on another backend
            continuer = _continuer(forwarded, scanner, plan, x.model, router=runtime.router,
                                   upstream=services.upstream, route=route, ctx=ctx,
                                   path=plan.path, body=body, headers=headers,
                                   timeouts=timeouts, count_text=meter.counter.count_text,
                                   prompt_tokens=meter.prompt_tokens, span=x.span,
                                   metrics=services.metrics)
            if continuer is not None:  # its prompts priced at the end, billed as it says
                meter.bill_continuation = continuer.billed
            try:
                await relay_response(forwarded, ctx, x.send, x.answer, scanner, closing,
                                     services.metrics,
                                     closing.progress if closing.provisional else None,
                                     continuer.resume if continuer is not None else None)
            finally:
                current = continuer.forwarded if continuer is not None else forwarded
                if current is not None:  # a continuation's failed ones are released
                    release(current, ctx)
                closing.after()
                # the engine's own name for the model, for the trace (the client saw the public)
                ctx.response_model = plan.backend_model
                if ctx.usage is None:  # 7. meter (a response that did not reach its end)
                    ctx.usage = await meter.measure(ctx.continuation_prompt)
        finally:
            if not ctx.recorded and (forwarded is None or ctx.first_token_ns is None):
                # failed before any output: tokens counted, cost 0 unless prices.bill_failed
                ctx.usage = await meter.failed(ctx.usage)
            if admitted is not None:  # settled in the background: the answer is complete
                services.settle_later(admitted.admission.settle(*_actual(ctx.usage)))
            _count_rejected_usage(services.metrics, ctx)
            if shadowed is not None:  # the primary's side of the comparison (read later)
                shadowed.primary(ctx, forwarded, scanner, meter.body)

    async def _admit(self, x: Exchange) -> Admitted | None:
        """3. admit: the request's limits checked and reserved, the ``x-ratelimit-*`` headers
        added to the answer (None: no limit applies to it)."""
        ctx, runtime, meter = x.ctx, x.runtime, x.meter
        scopes = runtime.scopes(ctx.tenant, ctx.key_id,
                                x.identity.limits if x.identity else None, x.model.name)
        if not scopes:
            return None
        admitted = await admit(
            self.services.quota, ctx, scopes, model=x.model.name,
            output=_output(x.model, x.parsed), counter=meter.counter,
            operation=meter.operation, payload=x.parsed.payload, size=meter.size,
            price=meter.price, on_refused=self.services.metrics.quota_rejected)
        x.answer += admitted.headers
        meter.split = admitted.split
        return admitted

    def _shadow(self, x: Exchange, headers: RawHeaders, salt: str) -> Pairing | None:
        """5. shadow: the request mirrored to the model's shadow pool, as chat, never billed
        (None: the model has no shadow, or this request is not mirrored)."""
        shadow = x.model.shadow
        if shadow is None:
            return None
        runtime, ctx = x.runtime, x.ctx
        return self.services.mirror.start(
            runtime.router, shadow, x.dialect.chat_path, x.parsed.payload, headers, ctx,
            _record_content(runtime, ctx),
            lambda pool, mirrored: isolate_body(mirrored, runtime.cache_mode(pool), salt))

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


async def _authenticate(runtime: Runtime, inbound: Inbound, ctx: RequestContext,
                        key_header: bytes | None) -> Identity | None:
    """The request's identity from ``Authorization``, else from its API's own key header
    (``key_header``: Anthropic's ``x-api-key``)."""
    identity = inbound.identity  # a batch line: authenticated when the batch was created
    if identity is None:
        header = header_value(inbound.headers, b"authorization")
        if header is None and key_header is not None:
            key = header_value(inbound.headers, key_header)
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


def _continuer(forwarded: Forwarded, scanner: Scanner | None, plan: Upstream, model: Model,
               **args: Any) -> Continuer | None:
    """The stream's continuation on another backend, when its model's ``continuation`` (else
    its pool's) is on and the backend streams chat completions (a chat stream, or one
    translated to chat) or Anthropic's Messages (passed through); never for a Responses
    stream passed through (``Upstream.continues_as``). It reads the stream's own scanner
    (``plan.scanner``: the one the relay feeds, without a shadow's tap around it) and counts
    the output sent with the backend's chat scanner (a translated stream's translator's)."""
    settings = model.continuation or forwarded.pool.config.continuation
    api = plan.continues_as
    if (not settings.enabled or scanner is None or forwarded.first_chunk is None
            or api is None):
        return None
    rewriter = plan.rewriter
    fresh = rewriter.fresh if rewriter is not None else lambda: AnswerRewriter(None)
    translator = plan.translator
    chat = translator.scanner if translator is not None else plan.scanner
    return Continuer(settings, forwarded, scanner=plan.scanner or scanner, rewriter=fresh,
                     api=api, output=chat, **args)


def _route(x: Exchange) -> tuple[Route, str]:
    """4. route: the version, pool and backend preference for the request, and the tenant's
    prompt-cache salt (the prefix index and the engines keep tenants apart by it,
    ``upstream/cache_isolation.py``)."""
    runtime, ctx, model, parsed = x.runtime, x.ctx, x.model, x.parsed
    session = header_value(x.inbound.headers, SESSION_HEADER)
    salt = runtime.cache_salts.salt(ctx.tenant)
    route = runtime.router.route_request(
        model, ctx.request_class or "", ctx.key_id, parsed.payload, session,
        salt if runtime.cache_mode(model.pool) != "shared" else None)
    route.tenant, route.weight = ctx.tenant or "", _weight(runtime, ctx.tenant)
    route.prompt_tokens = x.meter.route_tokens()
    route.tokens = route.prompt_tokens + _output(model, parsed)
    ctx.version, ctx.upstream_model = route.version, route.upstream_model
    return route, salt


def _meter(services: Services, runtime: Runtime, endpoint: Endpoint, ctx: RequestContext,
           model: Model, parsed: ParsedRequest, size: int) -> RequestMeter:
    """The request's meter, with its price and the bounds its backend's usage must hold to
    (``accounting.usage_bounds``)."""
    operation = endpoint.operation
    return RequestMeter(
        services.counter(model.encoding), operation, parsed.payload, size,
        price=runtime.prices.lookup(model.name, ctx.tenant),
        batch=ctx.request_class == "batch",
        limits=request_limits(parsed.payload, operation,
                              default_output=model.max_output_tokens),
        bill_failed=runtime.prices.bill_failed)


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
