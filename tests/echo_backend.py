"""A tiny real HTTP backend that echoes what it received (headers, path, body) as a completion.

Used where a test must see exactly what crossed the proxy hop; the simulator covers the rest.
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

from tests.ports import free_port


class EchoBackend:
    """Runs an aiohttp server in a thread; ``.requests`` holds every request seen."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict[str, object]] = []
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = {
            "path": request.path,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": json.loads(body) if body else None,
        }
        self.requests.append(seen)
        payload = {
            "id": "chatcmpl-echo",
            "object": "chat.completion",
            "created": 0,
            "model": seen["body"]["model"] if seen["body"] else "?",  # type: ignore[index]
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "echo"},
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.json_response(
            payload, headers={"X-Backend-Note": "relayed", "Connection": "keep-alive"}
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> EchoBackend:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
