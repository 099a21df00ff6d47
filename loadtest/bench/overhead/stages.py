"""``gateway serve`` with each stage of a request timed: ``python -m loadtest.bench.overhead.stages
serve --config ... --workers 1``, the per-stage medians written to ``$GATEWAY_STAGES_OUT``.

Why a launcher and not timestamps in the gateway: the gateway pays nothing for a profile it is
not running (no flag to test per request, no code in the hot path), and the stages are its own
functions, so wrapping them from outside, before the app is built, times exactly those calls.
The wrappers cost their own time (``perf_counter_ns`` twice and one more call per stage, about
1 µs per async stage on this machine): the profiled gateway is a set-up of its own in the
latency tool, next to the unprofiled one, and its p50 shows what the wrapping added.

One connection only: the request being timed is a single global (a keep-alive connection
answers strictly in order), so two requests at once would mix their stages. Every wall-clock
interval is taken on the gateway's event loop: an ``await`` inside a stage (the reserve's
round trip to Redis, the backend's answer) counts in that stage.

Stages on the request's path, from its first bytes in to its last bytes out:

=================  ============================================================================
protocol in        ``GatewayH1Protocol.data_received`` (the head parsed) to ``Pipeline.run``
auth               ``_authenticate`` (key -> identity; cached)
parse              ``Dialect.parse`` (the body into the typed request, in its API)
count              ``count_prompt`` (the prompt's tokens, for the estimate)
admit, own         ``admit`` less count and reserve (the estimate, the request, the headers)
reserve            ``RedisQuotaStore.reserve``: encode, the round trip, the reply
forward            ``forward``: route's attempt to the backend until its answer is in
relay, own         ``relay_response`` less meter, record and the protocol's writes
meter              ``RequestMeter.measure`` (tokens and cost of the answer, before its
                   last bytes)
record             ``Pipeline._record``: the usage record (buffered: queued; commit: awaited)
protocol out       ``_Exchange.send``: the head and body written to the socket
other              the rest of the span (the pipeline between stages: route, headers, ASGI)
=================  ============================================================================

and after the last bytes, off the request's path unless the next request comes sooner:
``telemetry`` (``RequestTracing.start`` before, ``Pipeline._finish``: span end, metrics and the
access line) and ``settle`` (``RedisQuotaStore.settle``, in the background: to its reply).
"""

from __future__ import annotations

import atexit
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_OUT = "GATEWAY_STAGES_OUT"
#: the stages in the order of the table (``other`` and ``total`` are derived)
PATH_STAGES = ("protocol in", "auth", "parse", "count", "admit, own", "reserve", "forward",
               "relay, own", "meter", "record", "protocol out", "other")
AFTER_STAGES = ("telemetry", "settle")
RESERVE_PARTS = ("reserve: to its write", "reserve: write to reply read",
                 "reserve: reply read to return")
_KEEP = 50_000  # requests kept (the newest)

_now = time.perf_counter_ns


class _Profile:
    """The stage times of the request in progress and of the finished ones."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.current: dict[str, int] = {}
        self.t_in = 0
        self.done: list[dict[str, int]] = []
        self.settles: list[int] = []

    def add(self, stage: str, ns: int) -> None:
        self.current[stage] = self.current.get(stage, 0) + ns

    def finish(self) -> None:
        """The request's last bytes are written: close its record."""
        cur = self.current
        if self.t_in and "protocol out" in cur:
            cur["total"] = _now() - self.t_in
            self.done.append(derive(cur))
            if len(self.done) > 2 * _KEEP:
                del self.done[:_KEEP]
        self.current = {}
        self.t_in = 0

    def dump(self) -> None:
        """The medians, at exit (computing them costs the loop milliseconds: never live)."""
        done = self.done[-_KEEP:]
        rows: dict[str, Any] = {"requests": len(done)}
        for stage in (*PATH_STAGES, "total", "telemetry", *RESERVE_PARTS):
            values = [r.get(stage, 0) for r in done]
            rows[stage] = statistics.median(values) / 1e3 if values else None
        rows["settle on the wire"] = sum(r.get("settle on the wire", 0) for r in done)
        rows["settle"] = statistics.median(self.settles[-_KEEP:]) / 1e3 if self.settles else None
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows) + "\n")
        tmp.replace(self.out)


def _timed_async(profile: _Profile, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = _now()
        try:
            return await fn(*args, **kwargs)
        finally:
            profile.add(stage, _now() - started)
    return wrapper


def _timed(profile: _Profile, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = _now()
        try:
            return fn(*args, **kwargs)
        finally:
            profile.add(stage, _now() - started)
    return wrapper


def install(profile: _Profile) -> None:
    """Wrap the stages' functions where the pipeline looks them up."""
    from gateway.accounting.meter import RequestMeter
    from gateway.dialects import dialect
    from gateway.http import server
    from gateway.pipeline import run as pipeline
    from gateway.quota import admit as admit_module
    from gateway.quota.redis import RedisQuotaStore
    from gateway.telemetry.tracing import RequestTracing

    proto_data = server.GatewayH1Protocol.data_received

    def data_received(self: Any, data: bytes) -> None:
        if not profile.t_in and self.active is None:
            profile.t_in = _now()  # the first bytes of the next request
        proto_data(self, data)

    server.GatewayH1Protocol.data_received = data_received  # type: ignore[method-assign]

    run = pipeline.Pipeline.run

    async def pipeline_run(self: Any, inbound: Any, send: Any) -> None:
        if profile.t_in:
            profile.add("protocol in", _now() - profile.t_in)
        await run(self, inbound, send)

    pipeline.Pipeline.run = pipeline_run  # type: ignore[method-assign]

    exchange_send = server._Exchange.send

    async def send(self: Any, message: dict[str, Any]) -> None:
        started = _now()
        await exchange_send(self, message)
        profile.add("protocol out", _now() - started)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            profile.finish()

    server._Exchange.send = send  # type: ignore[method-assign]

    pipeline._authenticate = _timed_async(profile, "auth", pipeline._authenticate)
    for kind in (dialect.ChatDialect, dialect.FrontendDialect):
        kind.parse = _timed_async(profile, "parse", kind.parse)  # type: ignore[method-assign]
    admit_module.count_prompt = _timed(profile, "count", admit_module.count_prompt)
    pipeline.admit = _timed_async(profile, "admit", pipeline.admit)
    _time_reserve(profile, RedisQuotaStore)
    pipeline.forward = _timed_async(profile, "forward", pipeline.forward)
    pipeline.relay_response = _timed_async(profile, "relay", pipeline.relay_response)
    RequestMeter.measure = _timed_async(  # type: ignore[method-assign]
        profile, "meter", RequestMeter.measure)
    pipeline.Pipeline._record = _timed_async(  # type: ignore[method-assign]
        profile, "record", pipeline.Pipeline._record)
    # telemetry runs after the last bytes: it is kept on the request just written
    start = RequestTracing.start

    def tracing_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = _now()
        try:
            return start(self, *args, **kwargs)
        finally:
            profile.add("telemetry", _now() - started)

    RequestTracing.start = tracing_start  # type: ignore[method-assign]
    finish = pipeline.Pipeline._finish

    def pipeline_finish(self: Any, *args: Any) -> None:
        started = _now()
        finish(self, *args)
        if profile.done:  # the request whose last bytes were just written
            last = profile.done[-1]
            last["telemetry"] = last.get("telemetry", 0) + _now() - started

    pipeline.Pipeline._finish = pipeline_finish  # type: ignore[method-assign]
    settle = RedisQuotaStore.settle

    async def store_settle(self: Any, *args: Any, **kwargs: Any) -> bool:
        started = _now()
        try:
            return await settle(self, *args, **kwargs)
        finally:
            profile.settles.append(_now() - started)

    RedisQuotaStore.settle = store_settle  # type: ignore[method-assign]


def _time_reserve(profile: _Profile, store: Any) -> None:
    """The reserve, and its round trip in three: until its write, the write until Redis's
    reply is read (the wire and Redis), the read until the reserve returns (the reply's
    decoding and the coroutine's wake-up). Also counted: how often a settle was still
    unanswered on the wire when the reserve was written."""
    from gateway.redis.pipelined import _Protocol

    marks = {"reserve": 0, "written": 0, "read": 0}
    flush = _Protocol.flush

    def proto_flush(self: Any) -> None:
        if marks["reserve"] and not marks["written"] and self.pending:
            marks["written"] = _now()
            if len(self.waiters) > len(self.pending):
                profile.add("settle on the wire", 1)
        flush(self)

    _Protocol.flush = proto_flush  # type: ignore[method-assign]
    data = _Protocol.data_received

    def proto_data(self: Any, chunk: bytes) -> None:
        if marks["written"]:
            marks["read"] = _now()
        data(self, chunk)

    _Protocol.data_received = proto_data  # type: ignore[method-assign]
    reserve = store.reserve

    async def store_reserve(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = marks["reserve"] = _now()
        marks["written"] = marks["read"] = 0
        try:
            return await reserve(self, *args, **kwargs)
        finally:
            end = _now()
            profile.add("reserve", end - started)
            if marks["written"] and marks["read"]:
                profile.add("reserve: to its write", marks["written"] - started)
                profile.add("reserve: write to reply read", marks["read"] - marks["written"])
                profile.add("reserve: reply read to return", end - marks["read"])
            marks["reserve"] = marks["written"] = marks["read"] = 0

    store.reserve = store_reserve


def derive(row: dict[str, int]) -> dict[str, int]:
    """``admit, own``, ``relay, own`` and ``other`` of one request's raw times."""
    out = dict(row)
    out["admit, own"] = row.get("admit", 0) - row.get("count", 0) - row.get("reserve", 0)
    out["relay, own"] = (row.get("relay", 0) - row.get("meter", 0) - row.get("record", 0)
                         - row.get("protocol out", 0))
    named = sum(out.get(s, 0) for s in PATH_STAGES if s != "other")
    # the span's start (``telemetry`` so far) is on the path too; the rest comes after
    out["other"] = row.get("total", 0) - named - row.get("telemetry", 0)
    return out


def main(argv: list[str] | None = None) -> None:
    out = Path(os.environ.get(ENV_OUT, "stages.json"))
    profile = _Profile(out)
    install(profile)
    atexit.register(profile.dump)
    from gateway.cli import main as gateway_main

    sys.argv = ["gateway", *(sys.argv[1:] if argv is None else argv)]
    gateway_main()


if __name__ == "__main__":
    # run as a script (``python .../stages.py``, to time another tree's gateway): its own
    # directory must not shadow the ``gateway`` package with the bench's ``gateway.py``
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    main()
