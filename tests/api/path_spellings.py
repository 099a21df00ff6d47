"""Spellings of a request path an attacker tries on a gate, each labelled with what it must do.

``same``: canonicalises to the path itself (served exactly as the plain spelling is);
``bad``: does not canonicalise cleanly (400 ``invalid_path``, or the server's own 400 for a byte
its parser refuses); ``case``: another letter case (gated like the admin tree, routed nowhere).
The labels are written by hand, not derived from the code under test.
"""

from __future__ import annotations

from collections.abc import Callable

Spelling = tuple[str, str, Callable[[str], str]]


def _enc_first(p: str, ch: str, code: str) -> str:
    if ch not in p[1:]:
        return p
    i = p.index(ch, 1)
    return p[:i] + code + p[i + 1:]


def _second_slash(p: str, code: str) -> str:
    i = p.index("/", 1) if "/" in p[1:] else len(p)
    return p[:i] + code + p[i + 1:] if i < len(p) else p + code


SPELLINGS: list[Spelling] = [
    ("plain", "same", lambda p: p),
    ("leading //", "same", lambda p: "/" + p),
    ("leading ///", "same", lambda p: "//" + p),
    ("every / doubled", "same", lambda p: p.replace("/", "//")),
    ("leading %2F", "same", lambda p: "/%2F" + p[1:]),
    ("leading %2f", "same", lambda p: "/%2f" + p[1:]),
    ("second / as %2F", "same", lambda p: _second_slash(p, "%2F")),
    ("second / as %2f", "same", lambda p: _second_slash(p, "%2f")),
    ("every / after the first as %2F", "same", lambda p: "/" + p[1:].replace("/", "%2F")),
    ("'a' as %61", "same", lambda p: _enc_first(p, "a", "%61")),
    ("'d' as %64", "same", lambda p: _enc_first(p, "d", "%64")),
    ("first segment fully encoded", "same",
     lambda p: "/" + "".join(f"%{ord(c):02x}" for c in p[1:].split("/")[0]) + p[
         1 + len(p[1:].split("/")[0]):]),
    ("trailing /", "same", lambda p: p + "/"),
    ("trailing //", "same", lambda p: p + "//"),
    ("trailing %2F", "same", lambda p: p + "%2F"),
    ("//%2F leading", "same", lambda p: "//%2F" + p[1:]),
    ("query with //", "same", lambda p: p + "?x=//admin/keys"),
    ("query with ../", "same", lambda p: p + "?next=/../../admin"),
    ("absolute form", "same", lambda p: "http://127.0.0.1" + p),
    ("upper case", "case", lambda p: p.upper()),
    ("capitalised", "case", lambda p: "/" + p[1:].capitalize()),
    ("'A' as %41", "case", lambda p: _enc_first(p, "a", "%41")),
    ("./ leading", "bad", lambda p: "/." + p),
    ("../ after a segment", "bad", lambda p: "/x/.." + p),
    ("dot segment inside", "bad", lambda p: _second_slash(p, "/./")),
    ("%2e segment", "bad", lambda p: "/%2e" + p),
    ("%2E%2E segment", "bad", lambda p: "/%2E%2E" + p),
    ("..%2F climb", "bad", lambda p: "/x/..%2F" + p[1:]),
    ("; parameter on the first segment", "bad",
     lambda p: "/" + p[1:].split("/")[0] + ";x=1" + p[1 + len(p[1:].split("/")[0]):]),
    ("; parameter at the end", "bad", lambda p: p + ";jsessionid=1"),
    ("%3B parameter", "bad", lambda p: p + "%3Bx"),
    ("double-encoded /", "bad", lambda p: "/%252F" + p[1:]),
    ("double-encoded a", "bad", lambda p: _enc_first(p, "a", "%2561")),
    ("malformed escape", "bad", lambda p: p + "%zz"),
    ("truncated escape", "bad", lambda p: p + "%2"),
    ("encoded NUL", "bad", lambda p: p + "%00"),
    ("encoded tab", "bad", lambda p: _second_slash(p, "%09/")),
    ("backslash", "bad", lambda p: _second_slash(p, "\\")),
    ("encoded backslash", "bad", lambda p: _second_slash(p, "%5C")),
    ("invalid UTF-8", "bad", lambda p: p + "%ff"),
]
