"""Cross-tenant invariant: no request ever receives bytes of another request's response.

Many concurrent requests go through one native client (one pool, keep-alive) to a backend that
misbehaves at random: interim 1xx responses first, extra bytes after the answer (a forged answer
naming another request), broken framing, an early close. Every valid answer embeds the id of the
request it answers, so a body that names any other id - or the forged one - is a leak. Failures
are allowed (they are the backend's fault); wrong answers are not.

Stray bytes travel with (or inside the segment of) the answer's end here. Stray bytes a backend
sends *later* are caught when they arrive while the connection is idle, or by the poll before
reuse (``tests/http/test_conformance.py``, injected-200-in-later-segment); bytes held back
until the next request has been written are indistinguishable from an honest answer to it -
the keep-alive ambiguity of HTTP/1.1 that every pooling client (Go's net/http, httpcore) shares.
"""

from __future__ import annotations

import asyncio
import random
import re

from gateway.config import Timeouts
from gateway.http.base import UpstreamClient, make_upstream
from gateway.http.errors import UpstreamError
from tests.http.hostile import HostileBackend, Script

REQUESTS = 400
CONCURRENCY = 24


def _answer(rid: bytes, rng: random.Random) -> Script:
    body = b'{"id": "' + rid + b'"}'
    ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body), body)
    forged = b"HTTP/1.1 200 OK\r\ncontent-length: 16\r\n\r\n{\"id\": \"forged\"}"
    mode = rng.choice(["ok", "ok", "1xx", "1xx-split", "trailing", "trailing-later", "broken",
                       "early-close", "chunked"])
    if mode == "1xx":
        return Script([b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + ok])
    if mode == "1xx-split":
        return Script([b"HTTP/1.1 100 Continue\r\n\r\n", ok[:10], ok[10:]])
    if mode == "trailing":
        return Script([ok + forged])
    if mode == "trailing-later":  # the answer's last byte and the forgery in a later segment
        return Script([ok[:-1], ok[-1:] + forged])
    if mode == "broken":  # bad chunk framing after part of the body
        return Script([b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                       b"3\r\n%s\r\nzz\r\n" % body[:3]], close=rng.random() < 0.5)
    if mode == "early-close":
        return Script([ok[: rng.randrange(len(ok))]], close=True)
    if mode == "chunked":
        return Script([b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                       b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)])
    return Script([ok])


async def _run(client: UpstreamClient) -> tuple[int, int]:
    rng = random.Random(1414)

    def script(_: int, request: bytes) -> Script:
        found = re.search(rb'"rid": "(r\d+)"', request)
        assert found is not None
        return _answer(found.group(1), rng)

    sem = asyncio.Semaphore(CONCURRENCY)
    good = failed = 0

    async def one(i: int) -> None:
        nonlocal good, failed
        rid = b"r%d" % i
        async with sem:
            try:
                resp = await client.post(url, b'{"rid": "' + rid + b'"}', [])
                try:
                    body = await resp.read()
                finally:
                    resp.close()
            except UpstreamError:
                failed += 1
                return
        assert body == b'{"id": "' + rid + b'"}', (client, rid, body)
        good += 1

    async with HostileBackend(script) as url:
        await asyncio.gather(*(one(i) for i in range(REQUESTS)))
    return good, failed


async def test_no_request_gets_another_requests_bytes() -> None:
    """Each answered request got exactly its own body; some failed, none was cross-wired."""
    for kind in ("native", "aiohttp"):
        client = make_upstream(kind, Timeouts(connect=5, first_token=5, idle=1, total=10), 16)
        await client.start()
        try:
            good, failed = await _run(client)
        finally:
            await client.close()
        assert good + failed == REQUESTS
        assert good > REQUESTS // 3 and failed > 0, (kind, good, failed)
