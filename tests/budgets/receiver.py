"""A real HTTP webhook receiver on a free loopback port, for the alert tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from tests.ports import free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Answers each POST with the next of ``statuses`` (then 200), and keeps what came."""

    statuses: list[int] = field(default_factory=list)
    got: list[Received] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.Response:
        self.got.append(Received(dict(request.headers), await request.read()))
        self._arrived.set()
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status, text="ok")

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        """Until ``count`` POSTs arrived (a generous bound: the box is shared)."""
        async with asyncio.timeout(timeout):
            while len(self.got) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.got

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
