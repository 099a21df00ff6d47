"""The simulator's raw ASGI application: routing, fault injection, error rendering.

``SimApp(config)`` builds its engine and metrics registry and starts nothing; the engine's loop
starts with the ASGI lifespan (or the first request). Endpoints:

- ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream`` supported)
- ``POST /v1/responses`` (OpenAI's Responses API; ``stream`` supported)
- ``POST /v1/messages`` (Anthropic's Messages API; ``stream`` supported),
  ``POST /v1/messages/count_tokens``
- ``POST /v1/embeddings``
- ``GET /v1/models``, ``GET /v1/models/{id}``
- ``GET /health``, ``GET /metrics`` (vLLM names), ``GET /sim/stats`` (JSON, for tests)

Errors take the shape of the API called: Anthropic's under ``/v1/messages``, OpenAI's elsewhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.sim import metrics
from gateway.sim.asgi import read_body, send_bytes, watch_disconnect
from gateway.sim.cache import PromptCache
from gateway.sim.completions import parse_completion
from gateway.sim.embeddings import embedding_answer
from gateway.sim.engine import Engine
from gateway.sim.errors import (
    BadRequest,
    InjectedError,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    RateLimited,
    SimHTTPError,
    render_error,
)
from gateway.sim.faults import FaultHeaderError, parse_faults
from gateway.sim.messages import count_tokens_body, parse_message
from gateway.sim.respond import Call, respond
from gateway.sim.responses import parse_response
from gateway.sim.stats import APIS, ApiCounters
from gateway.sim.text import vocabulary
from gateway.tokenizers import get_encoding

if TYPE_CHECKING:
    from gateway.sim.answer import Plan, Renderer
    from gateway.sim.asgi import Receive, Scope, Send
    from gateway.sim.config import SimConfig

__all__ = ["SimApp"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

_POST_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
}
_GET_ROUTES = frozenset({"/health", "/metrics", "/sim/stats", "/v1/models"})


class SimApp:
    """One simulated OpenAI-compatible replica as an ASGI callable."""

    def __init__(self, config: SimConfig, engine: Engine | None = None) -> None:
        self.config = config
        self.engine = engine or Engine(
            config.profile,
            speedup=config.speedup,
            jitter=config.jitter,
            seed=config.seed,
            prefix_caching=config.prefix_caching,
        )
        self.registry = metrics.make_registry(self.engine, config.models[0])
        self.prompt_cache = PromptCache(config.prompt_cache_entries)
        #: requests and answered usage per API, for ``/sim/stats``
        self.api_stats = {api: ApiCounters() for api in APIS}
        self._rng = random.Random(config.seed)
        self._created = int(time.time())

    def __repr__(self) -> str:
        return f"<SimApp models={list(self.config.models)} {self.engine!r}>"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                await self._route(scope, receive, send)
            except SimHTTPError as exc:
                await _send_error(send, exc, scope["path"])
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # Load the BPE files now (~0.5 s) rather than inside the first request's TTFT.
                get_encoding(self.config.encoding)
                vocabulary()
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.engine.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        kind = _POST_ROUTES.get(path)
        if kind is not None:
            if method != "POST":
                raise MethodNotAllowed(f"use POST for {path}")
            await self._post(kind, scope, receive, send)
        elif path in _GET_ROUTES or path.startswith("/v1/models/"):
            if method not in ("GET", "HEAD"):
                raise MethodNotAllowed(f"use GET for {path}")
            await self._get(path, send)
        elif path.startswith("/v1/responses/"):
            raise NotFound("the simulator stores no responses (the gateway keeps stored ones)")
        else:
            raise NotFound(f"no route {method} {path}")

    # -- GET -------------------------------------------------------------------------------------

    async def _get(self, path: str, send: Send) -> None:
        if path == "/health":
            await send_bytes(send, 200, b"")
        elif path == "/metrics":
            body = metrics.render(self.registry)
            await send_bytes(send, 200, body, content_type=metrics.CONTENT_TYPE.encode())
        elif path == "/sim/stats":
            await send_bytes(send, 200, _encode(self.snapshot()))
        elif path == "/v1/models":
            data = [self._model_card(m) for m in self.config.models]
            await send_bytes(send, 200, _encode({"object": "list", "data": data}))
        else:
            name = path.removeprefix("/v1/models/")
            await send_bytes(send, 200, _encode(self._model_card(self._check_model(name))))

    def snapshot(self) -> dict[str, Any]:
        """The engine's snapshot plus requests and usage per API and the prompt cache's size."""
        apis = {name: dataclasses.asdict(c) for name, c in self.api_stats.items()}
        cache = len(self.prompt_cache)
        return {**self.engine.snapshot(), "apis": apis, "prompt_cache_entries": cache}

    def _model_card(self, name: str) -> dict[str, Any]:
        max_len = self.config.profile.max_model_len
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "gateway-sim",
            "max_model_len": max_len,
        }

    def _check_model(self, name: str) -> str:
        if self.config.strict_models and name not in self.config.models:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
        return name

    # -- POST ------------------------------------------------------------------------------------

    async def _post(self, kind: str, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await read_body(receive)
        if raw is None:
            return  # client left before sending the body
        call = Call()
        watcher = asyncio.get_running_loop().create_task(
            watch_disconnect(receive, call.on_disconnect)
        )
        try:
            await self._handle(kind, scope, raw, send, call)
        except SimHTTPError as exc:
            if not call.disconnected:
                await _send_error(send, exc, scope["path"])
        finally:
            watcher.cancel()

    async def _handle(self, kind: str, scope: Scope, raw: bytes, send: Send, call: Call) -> None:
        cfg = self.config
        try:
            faults = parse_faults(scope["headers"], cfg.faults)
        except FaultHeaderError as exc:
            raise BadRequest(str(exc)) from exc
        if faults.extra_latency_ms > 0:
            await asyncio.sleep(faults.extra_latency_ms / 1000)
        if faults.retry_after is not None:
            raise RateLimited("simulated rate limit", retry_after=faults.retry_after)
        status = faults.error_to_inject(self._rng)
        if status is not None:
            raise InjectedError(status)
        body = self._decode(raw)
        model = body.get("model")
        model = self._check_model(model) if isinstance(model, str) else cfg.models[0]
        if kind == "count_tokens":
            await send_bytes(send, 200, count_tokens_body(body, cfg=cfg))
            return
        counters = self.api_stats[kind]
        counters.requests += 1
        if kind == "embeddings":
            out, tokens = embedding_answer(
                body, model=model, default_dim=cfg.embedding_dim, encoding=cfg.encoding
            )
            counters.add(tokens, 0)
            await send_bytes(send, 200, out)
            return
        plan, renderer = self._plan(kind, body, model)
        await respond(send, self.engine, plan, renderer, faults, call, counters)

    def _plan(self, kind: str, body: dict[str, Any], model: str) -> tuple[Plan, Renderer]:
        cfg = self.config
        if kind == "responses":
            return parse_response(body, model=model, cfg=cfg)
        if kind == "messages":
            return parse_message(body, model=model, cfg=cfg, cache=self.prompt_cache)
        return parse_completion(body, chat=kind == "chat", model=model, cfg=cfg)

    @staticmethod
    def _decode(raw: bytes) -> dict[str, Any]:
        try:
            body = _decode(raw)
        except msgspec.DecodeError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("the JSON body must be an object")
        return body


async def _send_error(send: Send, error: SimHTTPError, path: str) -> None:
    """``error`` in the shape of the API ``path`` belongs to."""
    status, body = render_error(error, "messages" if path.startswith("/v1/messages") else "")
    await send_bytes(send, status, body, error.headers)
