"""Differential fuzzing of the native client against h11.

Hypothesis builds backend byte streams - valid responses with random headers, bodies and
framing (Content-Length, chunked with trailers, close-delimited), optionally after 1xx interim
responses and followed by stray bytes, sometimes mutated at one byte - and sends them through a
real socket split at random points into TCP writes with small pauses, then closes. The native
client's verdict (status and body, or error) must equal h11's on the same bytes
(:func:`tests.http.hostile.reference`), with one normalisation, the client being stricter
than h11 on purpose, each allowed by the RFCs:

* obs-fold is refused (RFC 9112 5.2 lets a gateway answer 502);
* a bare LF as a line end in a head is refused (RFC 9112 2.2 only allows accepting it);
* control bytes (other than HTAB) in a header line are refused: h11 accepts any byte but NUL
  and whitespace in a field value, llhttp refuses CTLs (RFC 9110 5.5 makes them invalid).

And one where it is laxer, harmlessly: llhttp accepts any byte in a status line's reason
phrase, which h11 checks; the gateway never reads or relays the reason phrase, so the reference
sees it replaced by "R". And llhttp skips CR/LF before a status line (padding, no data), which
the reference sees removed.

200 examples by default (well under a minute on a loaded box). For a longer run::

    UPSTREAM_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/http/test_fuzz_h1.py -q
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Timeouts
from gateway.http.client import H1Upstream
from tests.http.hostile import OBS_FOLD, HostileBackend, Script, client_verdict, reference

EXAMPLES = int(os.environ.get("UPSTREAM_FUZZ_EXAMPLES", "200"))
TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=12)
VALUE = st.binary(max_size=30).map(lambda b: bytes(c for c in b if 0x20 <= c < 0x7F).strip())
RESERVED = (b"content-length", b"transfer-encoding", b"connection")


@st.composite
def responses(draw: st.DrawFn) -> list[bytes]:
    """One backend answer as a list of TCP writes."""
    out = b""
    for _ in range(draw(st.integers(0, 2))):
        out += b"HTTP/1.1 %d Interim\r\n" % draw(st.sampled_from([100, 103]))
        out += b"".join(b"%s: %s\r\n" % (n.encode(), v)
                        for n, v in draw(st.lists(st.tuples(TOKEN, VALUE), max_size=2)))
        out += b"\r\n"
    status = draw(st.sampled_from([200, 201, 204, 304, 400, 404, 500]))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    head = b"HTTP/%s %d Reason\r\n" % (version, status)
    for name, value in draw(st.lists(st.tuples(TOKEN, VALUE), max_size=6)):
        if name.encode() not in RESERVED:
            head += b"%s: %s\r\n" % (name.encode(), value)
    body = draw(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"_")))
    framing = draw(st.sampled_from(["length", "length-off", "chunked", "close"]))
    if framing == "length":
        msg = head + b"content-length: %d\r\n\r\n" % len(body) + body
    elif framing == "length-off":
        msg = head + b"content-length: %d\r\n\r\n" % (len(body) + draw(st.integers(-5, 5))) + body
    elif framing == "chunked":
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        msg = head + b"transfer-encoding: chunked\r\n\r\n"
        msg += b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c)
        msg += b"0\r\n"
        if draw(st.booleans()):
            msg += b"x-trailer: t\r\n"
        msg += b"\r\n"
    else:
        msg = head + b"connection: close\r\n\r\n" + body
    out += msg
    if draw(st.integers(0, 4)) == 0:
        out += draw(st.sampled_from([b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nX", b"junk"]))
    if out and draw(st.integers(0, 3)) == 0:  # mutate one byte
        at = draw(st.integers(0, len(out) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete"]))
        byte = bytes([draw(st.integers(0, 255))])
        if op == "flip":
            out = out[:at] + byte + out[at + 1:]
        elif op == "insert":
            out = out[:at] + byte + out[at:]
        else:
            out = out[:at] + out[at + 1:]
    splits = sorted(set(draw(st.lists(st.integers(1, max(1, len(out) - 1)), max_size=4))))
    return [out[a:b] for a, b in zip([0, *splits], [*splits, len(out)], strict=True) if out[a:b]]


_REASON = re.compile(rb"(HTTP/1\.[01] \d{3} )[^\r\n]*")
_BARE_LF = re.compile(rb"(?<!\r)\n")
_CTL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _heads(data: bytes) -> Iterator[bytes]:
    """Each response head in ``data`` (interim ones, then the final one), as sent."""
    pos = 0
    while (end := data.find(b"\r\n\r\n", pos)) >= 0:
        head = data[pos:end]
        yield head
        if not re.match(rb"HTTP/1\.[01] 1\d\d", head):
            return
        pos = end + 4
    yield data[pos:]


def _plain_reasons(data: bytes) -> bytes:
    """``data`` with the reason phrase of each status line (not of body text) set to "R", and
    the CR/LF padding llhttp skips before a status line removed."""
    heads = list(_heads(data))
    rest = data[sum(len(h) + 4 for h in heads[:-1]) + len(heads[-1]):]
    out = [_REASON.sub(rb"\1R", h.lstrip(b"\r\n"), count=1) for h in heads]
    return b"\r\n\r\n".join(out) + rest


def _stricter(data: bytes) -> bool:
    """Bytes the native client refuses on purpose where h11 accepts them: folded lines,
    control characters and bare LFs in header fields, the chunked trailer's fields included
    (llhttp holds a trailer field to the header field's grammar; h11 does not)."""
    heads = list(_heads(data))
    if any(OBS_FOLD.search(h) or _CTL.search(h.partition(b"\n")[2]) or _BARE_LF.search(h)
           for h in heads):
        return True
    body = data[sum(len(h) + 4 for h in heads):]
    trailer = _trailer(body) if b"chunked" in heads[-1].lower() else None
    return trailer is not None and bool(
        OBS_FOLD.search(trailer) or _CTL.search(trailer) or _BARE_LF.search(trailer))


def _trailer(body: bytes) -> bytes | None:
    """The trailer section of a chunked body (None: the framing does not get that far)."""
    pos = 0
    while True:
        end = body.find(b"\r\n", pos)
        if end < 0:
            return None
        size_text = body[pos:end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return None
        if size == 0:
            close = body.find(b"\r\n\r\n", end)
            return body[end + 2:close] if close >= 0 else body[end + 2:]
        pos = end + 2 + size + 2


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(writes=responses())
def test_native_verdict_matches_h11(loop: asyncio.AbstractEventLoop, writes: list[bytes]) -> None:
    """Same outcome class as h11 over the same bytes, however they are split."""
    data = b"".join(writes)
    expected, _ = reference(_plain_reasons(data), eof=True)
    if _stricter(data):
        expected = ("error",)
    script = Script(writes, close=True, pause=0.001)

    async def run() -> tuple[object, ...]:
        client = H1Upstream(Timeouts(connect=5, first_token=5, idle=5, total=10), 4)
        try:
            async with HostileBackend(lambda n, _: script) as url:
                return await client_verdict(lambda: client.post(url, b"{}", []))
        finally:
            await client.close()

    assert loop.run_until_complete(run()) == expected, data
