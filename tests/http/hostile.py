"""A hostile backend for the upstream clients' tests, and h11 as the reference verdict.

:class:`HostileBackend` is a real asyncio TCP server. For each request it reads, it asks a
``script`` callable what to answer: the raw bytes to send, split into TCP writes with small
pauses, then whether to close the connection (EOF) or keep it open (and read the next request).
It records which connection served each request, so a test can see whether the client reused
a connection after a broken exchange.

:func:`reference` runs h11 (a strict, sans-I/O HTTP/1.1 state machine) over the same bytes and
returns the outcome class a correct client must reach: a response (status, body), a protocol
error, or an incomplete exchange (the bytes stop without EOF: a client times out). Where our
clients legitimately differ from h11, the difference is normalised here, in one place, each with
its reason (see :func:`reference`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import h11

from gateway.http.base import DEFAULT_LIMITS
from gateway.http.errors import UpstreamProtocolError, UpstreamTimeout
from tests.ports import free_port

__all__ = [
    "FOLLOW_UP",
    "OBS_FOLD",
    "HostileBackend",
    "Script",
    "Verdict",
    "client_verdict",
    "eventually",
    "read_request",
    "reference",
]

#: the answer to a follow-up request: a plain, valid keep-alive response
FOLLOW_UP = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
             b"follow-up!!")

#: ("response", status, body) | ("error",) | ("incomplete",)
Verdict = tuple[object, ...]


@dataclass
class Script:
    """What the backend answers to one request."""

    writes: list[bytes]
    close: bool = False  # EOF after the writes (else keep the connection and read on)
    pause: float = 0.005  # between writes, so each is its own TCP segment
    trickle: bytes = b""  # then send this every 50 ms, forever (a response that never ends)

    @property
    def data(self) -> bytes:
        return b"".join(self.writes)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and Content-Length body), as the clients frame theirs."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


@dataclass
class HostileBackend:
    """A scripted raw-socket backend; ``script(n, request)`` answers the n-th request (from 0)."""

    script: Callable[[int, bytes], Script]
    connections: int = 0
    served_on: list[int] = field(default_factory=list)  # connection number of each request
    answered: int = 0  # scripts fully written (trickles never are)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn_id = self.connections
        self._writers.add(writer)
        try:
            while True:
                request = await read_request(reader)
                n = len(self.served_on)
                self.served_on.append(conn_id)
                plan = self.script(n, request)
                for i, part in enumerate(plan.writes):
                    if i:
                        await asyncio.sleep(plan.pause)
                    writer.write(part)
                    await writer.drain()
                self.answered += 1
                while plan.trickle:
                    await asyncio.sleep(0.05)
                    writer.write(plan.trickle)
                    await writer.drain()
                if plan.close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def __aenter__(self) -> str:
        port = free_port()
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", port, limit=4 * 1024 * 1024
        )
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in list(self._writers):  # ends trickles and waits for requests
            writer.transport.abort()


_CL_AND_TE = re.compile(rb"(?is)\r\ncontent-length:.*\r\ntransfer-encoding:|"
                        rb"\r\ntransfer-encoding:.*\r\ncontent-length:")
OBS_FOLD = re.compile(rb"\r\n[ \t]")


def _head(data: bytes) -> bytes:
    end = data.find(b"\r\n\r\n")
    return data[: end + 2] if end >= 0 else data


def reference(data: bytes, eof: bool) -> tuple[Verdict, bool]:
    """h11's verdict on ``data`` as the answer to a POST, and whether the connection may be
    reused (a complete keep-alive response with no byte after it).

    Normalised for both clients, each allowed by RFC 9112 and deliberate:

    * Content-Length together with Transfer-Encoding: h11 lets chunked win; both clients
      refuse it (RFC 9112 6.3: such a message "ought to be handled as an error");
    * the head cap: h11 checks its ``max_incomplete_event_size`` only while an event is still
      incomplete, so the bytes are fed in 1 KiB pieces with that limit set to the clients'
      ``ResponseLimits.max_head``: a head over the cap is refused while it arrives, as ours is;
    * bare CR/LF after a complete message are skipped by llhttp as padding without leaving an
      unread byte; they do not make the connection unreusable here.

    Per-client differences (a client stricter than h11, never laxer) are listed by the tests.
    """
    if _CL_AND_TE.search(_head(data)):
        return ("error",), False
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=DEFAULT_LIMITS.max_head)
    conn.send(h11.Request(method="POST", target="/v1/chat/completions",
                          headers=[("host", "127.0.0.1"), ("content-length", "2")]))
    conn.send(h11.Data(data=b"{}"))
    conn.send(h11.EndOfMessage())
    body = bytearray()
    status = 0
    pos = 0
    sent_eof = False
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if pos < len(data):
                    conn.receive_data(data[pos : pos + 1024])
                    pos = min(pos + 1024, len(data))
                    continue
                if eof and not sent_eof:
                    conn.receive_data(b"")
                    sent_eof = True
                    continue
                return ("incomplete",), False
            if isinstance(event, h11.InformationalResponse):
                if event.status_code == 101:
                    return ("error",), False
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return ("error",), False
    except h11.RemoteProtocolError:
        return ("error",), False
    trailing, _ = conn.trailing_data
    rest = trailing + data[pos:]
    reusable = (conn.their_state is h11.DONE and conn.our_state is h11.DONE
                and not rest.lstrip(b"\r\n") and not eof)
    return ("response", status, bytes(body)), reusable


async def client_verdict(post: Callable[[], object]) -> Verdict:
    """Run one exchange through a client (``post`` returns the awaitable of ``client.post``)
    and classify it like :func:`reference`."""
    try:
        resp = await post()  # type: ignore[misc]
        try:
            body = await resp.read()
        finally:
            resp.close()
    except UpstreamTimeout:
        return ("incomplete",)
    except UpstreamProtocolError:
        return ("error",)
    return ("response", resp.status, body)


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout`` passes (False): for effects that
    arrive with the next socket read, without asserting how soon."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.01)
    return True
