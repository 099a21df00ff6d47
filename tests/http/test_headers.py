"""The hop rules of gateway.http.headers: what crosses in each direction, and what a Connection
header takes with it. The e2e tests (tests/gateway/test_headers_e2e.py) cover a request through
a real gateway; these pin the rules on their own, including the response side and the cases
where a Connection header names nothing to drop."""

from __future__ import annotations

from gateway.http.headers import request_headers, response_headers


def test_request_drops_credentials_framing_and_hop_by_hop() -> None:
    client = [(b"host", b"gw"), (b"authorization", b"Bearer sk"), (b"content-length", b"2"),
              (b"content-type", b"application/json"), (b"x-request-id", b"c"),
              (b"keep-alive", b"timeout=5"), (b"x-custom", b"1"), (b"accept", b"*/*")]
    assert request_headers(client) == [(b"x-custom", b"1"), (b"accept", b"*/*")]


def test_request_drops_what_connection_names() -> None:
    client = [(b"x-private", b"1"), (b"connection", b"keep-alive, X-Private ,,x-other"),
              (b"x-other", b"2"), (b"x-custom", b"kept")]
    assert request_headers(client) == [(b"x-custom", b"kept")]


def test_request_without_connection_keeps_order_and_duplicates() -> None:
    client = [(b"x-a", b"1"), (b"authorization", b"Bearer sk"), (b"x-a", b"2"), (b"x-b", b"3")]
    assert request_headers(client) == [(b"x-a", b"1"), (b"x-a", b"2"), (b"x-b", b"3")]


def test_response_lowers_names_and_drops_framing_and_identity() -> None:
    upstream = [(b"Server", b"nginx"), (b"Date", b"now"), (b"Content-Type", b"application/json"),
                (b"Content-Length", b"2"), (b"Connection", b"keep-alive"),
                (b"X-Request-Id", b"backend"), (b"Set-Cookie", b"a=1"), (b"X-Trace", b"t")]
    assert response_headers(upstream) == [(b"content-type", b"application/json"),
                                          (b"x-trace", b"t")]


def test_response_drops_what_connection_names() -> None:
    upstream = [(b"X-Secret", b"1"), (b"Connection", b"Keep-Alive, X-Secret"),
                (b"x-other", b"2"), (b"Connection", b"x-other"), (b"X-Kept", b"3")]
    assert response_headers(upstream) == [(b"x-kept", b"3")]


def test_response_connection_tokens_are_names_even_close() -> None:
    """``close`` (or any token) names a header; an empty token names none."""
    for connection in (b"close", b"Close,, "):
        upstream = [(b"close", b"1"), (b"Connection", connection), (b"X-Kept", b"3")]
        assert response_headers(upstream) == [(b"x-kept", b"3")]
