"""The RESP wire format, written in one place: commands out, and back into arguments.

The stores keep the parts of their hot commands that repeat on every request (script sha,
keys, limits) encoded once and join them per request (``quota/redis.py`` ``_Parts``); they
build those parts with :func:`bulk` and :func:`array_head` so that only this module knows the
framing. ``tests/quota/test_redis_encoding.py`` checks the joined bytes equal
:func:`encode_command` byte for byte. :func:`decode_command` turns such bytes back into
arguments for redis-py (``pyredis.py``), which cannot send pre-encoded commands.
"""

from __future__ import annotations

from typing import Any

import hiredis

__all__ = ["BULK", "array_head", "bulk", "decode_command", "encode_command"]

#: one bulk string as a ``%`` template (length, data): stores that join a hot command's parts
#: in one formatting step build their template from this
BULK = b"$%d\r\n%b\r\n"


def encode_command(args: tuple[Any, ...]) -> bytes:
    """One command in RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for value in args:
        kind = value.__class__
        if kind is str:
            data = value.encode()
        elif kind is bytes:
            data = value
        elif kind is int:
            data = b"%d" % value
        elif kind is float:
            data = repr(value).encode()
        elif isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
        else:
            raise TypeError(f"cannot send {kind.__name__} to Redis")
        append(b"$%d\r\n%b\r\n" % (len(data), data))  # BULK, inlined: the loop is hot
    return b"".join(parts)


def bulk(value: str | int | bytes) -> bytes:
    """One RESP bulk string, as :func:`encode_command` writes each argument: for callers that
    keep the fixed parts of a command they send on every request encoded once."""
    data = value if isinstance(value, bytes) else str(value).encode()
    return BULK % (len(data), data)


def array_head(count: int) -> bytes:
    """The start of a command of ``count`` arguments (followed by ``count`` bulk strings)."""
    return b"*%d\r\n" % count


def decode_command(command: bytes) -> list[Any]:
    """The arguments of one encoded command (bytes; the command name as ``str``, which
    redis-py's cluster routing and reply callbacks look up)."""
    reader = hiredis.Reader()
    reader.feed(command)
    args = reader.gets()
    if not isinstance(args, list) or not args or reader.gets() is not False:
        raise ValueError("not exactly one RESP command")
    args[0] = args[0].decode()
    return args
