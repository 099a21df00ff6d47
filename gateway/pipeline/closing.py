"""A request between the stages (``Exchange``), and the step the relay calls before the
response's last bytes (``Closing``: meter, then the durable usage record and a stored response;
a stream's provisional records; what the record says once the relay returned)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from gateway.accounting.meter import RequestMeter
    from gateway.auth.resolver import Identity
    from gateway.config import Model
    from gateway.context import RequestContext
    from gateway.dialects.dialect import Conversation, Dialect
    from gateway.dialects.shape import ParsedRequest
    from gateway.ledger import Ledger, UsageRecord
    from gateway.pipeline.inbound import Inbound
    from gateway.pipeline.run import Pipeline
    from gateway.runtime import Runtime
    from gateway.telemetry import RequestSpan
    from gateway.types import RawHeaders, Send
    from gateway.upstream.forward import Forwarded

__all__ = ["Closing", "Exchange"]


class Exchange:
    """One request between the stages, once it is parsed and classified: what every stage
    after admission reads (a plain slotted class: one is made per request)."""

    __slots__ = ("answer", "conversation", "ctx", "dialect", "identity", "inbound", "meter",
                 "model", "parsed", "raw", "runtime", "send", "span")

    def __init__(self, runtime: Runtime, inbound: Inbound, identity: Identity | None,
                 ctx: RequestContext, dialect: Dialect, conversation: Conversation,
                 parsed: ParsedRequest, model: Model, raw: bytes, meter: RequestMeter,
                 send: Send, answer: RawHeaders, span: RequestSpan) -> None:
        self.runtime, self.inbound, self.identity, self.ctx = runtime, inbound, identity, ctx
        self.dialect, self.conversation, self.parsed = dialect, conversation, parsed
        self.model, self.raw, self.meter = model, raw, meter
        #: the client's answer: ``send`` and the response headers the stages add
        self.send, self.answer, self.span = send, answer, span


class Closing:
    """7-8 before the response's last bytes, called by the relay (``upstream.relay.Closing``):
    meter, then the durable record (and a stored response, saved beside it). ``progress``
    writes a stream's provisional records; ``after`` settles what the record says once the
    relay returned (superseded provisional records, an answer that did not reach the client).
    """

    __slots__ = ("forwarded", "pipeline", "provisional", "record", "save", "x")

    def __init__(self, pipeline: Pipeline, x: Exchange, forwarded: Forwarded,
                 save: Callable[[bytes | None], Coroutine[Any, Any, None]] | None) -> None:
        self.pipeline, self.x, self.forwarded, self.save = pipeline, x, forwarded, save
        #: whether a stream writes provisional records
        self.provisional = keeps_provisional(x.runtime, pipeline.services.ledger)
        #: the usage record made before the last bytes (None: the response did not get there)
        self.record: UsageRecord | None = None

    async def before_last_bytes(self) -> None:
        x, pipeline = self.x, self.pipeline
        ctx, meter = x.ctx, x.meter
        ctx.usage = await meter.measure(ctx.continuation_prompt)  # 7. meter
        if ctx.status >= 400:  # an error answer: no output was delivered
            ctx.usage = await meter.failed(ctx.usage)
        save = self.save
        if save is not None and ctx.outcome == "completed" and ctx.status < 400:
            # the save is queued for its commit now and waited for after the record (both may
            # wait for a commit, side by side): no task of its own, where gather made two
            saved = save(self.forwarded.body)
            try:
                self.record = await pipeline._record(x.runtime, ctx)  # 8. record
            except BaseException:
                saved.close()  # the queued row still commits; nobody waits for it
                raise
            await saved
        else:
            self.record = await pipeline._record(x.runtime, ctx)  # 8. record

    def progress(self, chunks: int) -> None:
        """A stream's provisional record: what a killed process leaves billed."""
        x, pipeline = self.x, self.pipeline
        ctx = x.ctx
        record = msgspec.structs.replace(
            pipeline._make_record(x.runtime, ctx,
                                  x.meter.interrupted(chunks, ctx.continuation_prompt)),
            outcome="interrupted", delivered=None, sent_output=chunks)
        if pipeline.services.ledger.provisional(record):
            if ctx.provisional is None:
                ctx.provisional = []
            ctx.provisional.append(record)

    def after(self) -> None:
        """Once the relay returned: the final record stands for the provisional ones, and says
        so if its last bytes did not reach the client."""
        record, ctx = self.record, self.x.ctx
        if record is None:
            return
        if ctx.provisional:
            self.pipeline.services.ledger.supersede(record, ctx.provisional)
        if not ctx.delivered:
            self.pipeline._undelivered(ctx, record)


def keeps_provisional(runtime: Runtime, ledger: Ledger) -> bool:
    """Whether a stream writes provisional records: not with ``buffered`` durability (its
    final record may itself be lost to a killed process), nor without a file to keep them."""
    return ledger.inflight is not None and runtime.policy.store.ledger_durability != "buffered"
