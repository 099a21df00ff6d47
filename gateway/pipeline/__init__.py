"""The request pipeline: every stage of one request, in order, for live requests and batch
lines alike, for every client API.

    authenticate -> parse and classify -> admit -> route -> shadow -> forward and relay
    -> meter -> record

Read :meth:`Pipeline.run` and :meth:`Pipeline._serve` top to bottom to follow a request from the
HTTP edge to the ledger. Each stage is one call into the package that owns its rules, with typed
inputs and outputs:

=================  ============================================================================
authenticate       ``auth``: the key -> :class:`~gateway.auth.resolver.Identity` (or a 401)
parse, classify    the request's ``dialects.Dialect`` (its API: the body into the one request
                   shape, ``dialects.shape.ParsedRequest``; what to refuse before admission;
                   a Responses conversation it continues), ``routing.classes`` (the class)
admit              ``quota.admit``: the estimate, the reservation, the 429, ``x-ratelimit-*``
route              ``routing.router``: version (canary weight, stickiness), pools, affinity;
                   then the dialect's ``plan`` (pass through or translate, for that pool)
shadow             ``upstream.shadow``: mirror an admitted request, never billed
forward, relay     ``upstream.forward`` (attempts; retries only before the first byte) and
                   ``upstream.relay`` (the answer, chunk by chunk, bounded by the deadline)
meter              ``accounting.meter.RequestMeter``: tokens by kind (system, history, new,
                   tools, cached, output) and cost
record             ``ledger``: the one usage record of an admitted request
=================  ============================================================================

Meter and record run before the response's last bytes: the relay calls the request's
``_Closing`` (``upstream.relay.Closing``) before it sends them, so a client that has its whole
answer has a durable usage record. Whatever fails after admission still reaches meter and
record (``finally``): every admitted request leaves exactly one usage record and settles its
reservation once. The HTTP edge (``api/``) only reads the request line and headers, hands over
a way to read the body, and watches for a client that leaves; batch lines enter through
:meth:`Pipeline.run_line`.
"""

from gateway.pipeline.inbound import Inbound, LineAnswer, Services
from gateway.pipeline.run import Pipeline

__all__ = ["Inbound", "LineAnswer", "Pipeline", "Services"]
