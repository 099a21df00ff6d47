"""The worker processes of one ``gateway serve --workers N`` asking each other to act now.

Each worker holds its own policy snapshot and its own not-yet-flushed telemetry, so an action
that must hold for the whole server (an admin reload, a ``/metrics`` scrape that must count
every answered request) has to reach every worker, and the worker that was asked has to know
that it did before it answers. Each worker binds a Unix datagram socket named by its pid in
one directory shared by the workers of a server; :meth:`Siblings.broadcast` sends a named
action to every other socket there and waits (bounded) for each worker's reply. A socket whose
worker is gone refuses the datagram and is removed. Nothing runs when nobody asks: no polling.

The directory is ``$GATEWAY_WORKERS_DIR``, else ``workers/`` inside the per-server
``$PROMETHEUS_MULTIPROC_DIR`` that ``gateway serve`` makes for ``--workers > 1``; with neither,
a process has no siblings.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

__all__ = ["WORKERS_DIR_ENV", "Siblings", "workers_dir"]

WORKERS_DIR_ENV = "GATEWAY_WORKERS_DIR"
_log = logging.getLogger("gateway.app.workers")
_MAX_DATAGRAM = 65_536


def workers_dir() -> Path | None:
    """The directory shared by this server's workers, or None (a single process)."""
    explicit = os.environ.get(WORKERS_DIR_ENV)
    if explicit:
        return Path(explicit)
    multiproc = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(multiproc) / "workers" if multiproc else None


class Siblings:
    """This worker's socket in the shared directory: answers siblings' actions, asks them.

    ``handlers`` maps an action name to the coroutine function that performs it here. Start
    and close it from the event loop that runs the handlers.
    """

    def __init__(self, directory: Path,
                 handlers: Mapping[str, Callable[[], Awaitable[dict[str, Any]]]]) -> None:
        self.directory = directory
        self.handlers = dict(handlers)
        self.pid = os.getpid()
        self.path = directory / f"{self.pid}.sock"
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[str, dict[int, asyncio.Future[dict[str, Any]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        state = "open" if self._sock is not None else "closed"
        return f"<Siblings {self.path} {state} [waiting: {len(self._waiting)}]>"

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a previous process of this pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(str(self.path))
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    async def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        for task in list(self._tasks):
            task.cancel()

    def peers(self) -> list[Path]:
        """The other workers' sockets (some may belong to workers that have exited)."""
        try:
            return sorted(p for p in self.directory.glob("*.sock") if p != self.path)
        except OSError:
            return []

    async def broadcast(self, action: str, timeout: float) -> dict[int, dict[str, Any] | None]:
        """Ask every other worker to run ``action``; their replies by pid, None for a worker
        that did not answer within ``timeout`` seconds."""
        if self._sock is None:
            return {}
        call_id = f"{self.pid}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        futures: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiting[call_id] = futures
        message = json.dumps({"op": "call", "id": call_id, "action": action}).encode()
        try:
            for peer in self.peers():
                pid = _pid_of(peer)
                if pid is None:
                    continue
                futures[pid] = loop.create_future()
                if not self._send(message, peer):
                    del futures[pid]
            if futures:
                await asyncio.wait(set(futures.values()), timeout=timeout)
            return {pid: f.result() if f.done() and not f.cancelled() else None
                    for pid, f in futures.items()}
        finally:
            del self._waiting[call_id]
            for f in futures.values():
                f.cancel()

    def _send(self, message: bytes, peer: Path) -> bool:
        """Send one datagram; False (and the stale socket file removed) if nobody is there."""
        assert self._sock is not None
        try:
            self._sock.sendto(message, str(peer))
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(OSError):
                peer.unlink()
            return False
        except OSError as exc:  # a full queue, a path gone odd: that peer just won't answer
            _log.warning("workers: cannot reach %s: %s", peer.name, exc)
            return False
        return True

    def _readable(self) -> None:
        while self._sock is not None:
            try:
                data, sender = self._sock.recvfrom(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                message = json.loads(data)
            except ValueError:
                continue
            if message.get("op") == "call":
                task = asyncio.get_running_loop().create_task(self._answer(message, sender))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif message.get("op") == "reply":
                futures = self._waiting.get(str(message.get("id")), {})
                future = futures.get(int(message.get("pid", 0)))
                if future is not None and not future.done():
                    future.set_result(message.get("result") or {})

    async def _answer(self, message: dict[str, Any], sender: str) -> None:
        handler = self.handlers.get(str(message.get("action")))
        if handler is None:
            result: dict[str, Any] = {"error": f"unknown action {message.get('action')!r}"}
        else:
            try:
                result = await handler()
            except Exception as exc:  # the asker gets the reason; this worker keeps serving
                _log.exception("workers: action %s failed", message.get("action"))
                result = {"error": f"{type(exc).__name__}: {exc}"}
        if self._sock is None or not sender:
            return
        reply = json.dumps({"op": "reply", "id": message.get("id"), "pid": self.pid,
                            "result": result}).encode()
        self._send(reply, Path(sender))


def _pid_of(path: Path) -> int | None:
    try:
        return int(path.stem)
    except ValueError:
        return None
