"""RESP out and back: what the stores' pre-encoded commands are built from."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.redis import array_head, bulk, decode_command, encode_command
from gateway.redis.encoding import BULK


def test_encoding_is_resp_bulk_strings() -> None:
    assert encode_command(("SET", "k", 12, b"\x00v")) == (
        b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n$2\r\n\x00v\r\n"
    )
    with pytest.raises(TypeError):
        encode_command(("SET", "k", None))


def test_parts_join_to_the_generic_encoding() -> None:
    joined = array_head(3) + bulk("SET") + bulk(b"k") + BULK % (2, b"12")
    assert joined == encode_command(("SET", "k", 12))


@given(st.lists(st.binary() | st.integers() | st.text(), min_size=1, max_size=8))
def test_decode_reads_back_what_encode_wrote(args: list[bytes | int | str]) -> None:
    command = ("EVALSHA", *args)
    decoded = decode_command(encode_command(command))
    assert decoded[0] == "EVALSHA"  # the name as str: redis-py routes and parses by it
    assert decoded[1:] == [a if isinstance(a, bytes) else str(a).encode() for a in args]


def test_decode_wants_exactly_one_command() -> None:
    with pytest.raises(ValueError):
        decode_command(encode_command(("PING",)) * 2)
    with pytest.raises(ValueError):
        decode_command(b"+OK\r\n")
