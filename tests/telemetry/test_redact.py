"""The redaction processor: key shapes, credential and text fields, configured secrets."""

from __future__ import annotations

import pytest

from gateway.telemetry.redact import REDACTED, Redactor

R = Redactor(["my-admin-token-1234"])


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("key sk-abcdefgh12345678 used", f"key {REDACTED} used", id="sk"),
    pytest.param("sk-proj-A_b-C0123456789", REDACTED, id="sk-proj"),
    pytest.param("Authorization: Bearer abc.def.ghi", REDACTED, id="auth-header"),
    pytest.param("authorization=Basic dXNlcjpwYXNz", REDACTED, id="auth-basic"),
    pytest.param('{"api-key": "zzzz9999"}', f'{{"{REDACTED}"}}', id="api-key-json"),
    pytest.param("x-api-key: q1w2e3r4", REDACTED, id="x-api-key"),
    pytest.param("sent bearer eyJhbGciOiJIUzI1NiJ9", f"sent {REDACTED}", id="bearer"),
    pytest.param("token my-admin-token-1234!", f"token {REDACTED}!", id="configured"),
    pytest.param("ask-me 5 things; sk-1 short", "ask-me 5 things; sk-1 short", id="no-false-hit"),
    pytest.param("tokens used: 42", "tokens used: 42", id="plain"),
])
def test_text(text: str, expected: str) -> None:
    assert R.text(text) == expected


def test_fields_by_name() -> None:
    """Text and credential fields go whole; ids, counts and other fields stay readable."""
    event = R(None, "info", {
        "event": "x", "prompt": "hello", "Messages": [{"content": "hi"}], "completion": "c",
        "password": "pw", "api_key": "k", "key_id": "k-1", "tokens_in": 3, "error": None,
        "input": "", "_record": object(),
    })
    assert event["prompt"] == event["Messages"] == event["completion"] == REDACTED
    assert event["password"] == event["api_key"] == REDACTED
    assert (event["key_id"], event["tokens_in"], event["error"], event["input"]) == (
        "k-1", 3, None, "")


def test_nested_and_bytes() -> None:
    event = R(None, "info", {"event": "x", "ctx": {"headers": {"Authorization": "Bearer 123456789"},
                                                 "raw": b"sk-abcdefghijklmn"}})
    assert event["ctx"] == {"headers": {"Authorization": REDACTED}, "raw": REDACTED}


def test_short_configured_secrets_ignored() -> None:
    """Secrets under 4 characters would redact ordinary words; they are not matched."""
    assert Redactor(["ab", ""]).text("abc") == "abc"
