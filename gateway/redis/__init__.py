"""The gateway's Redis layer: every store's clients, errors and key names come from here.

``client.py`` builds every client (one node, TLS, unix socket, Cluster); ``base.py`` is the
interface the stores use (``RedisLike``), met by the lean pipelined client (``pipelined.py``,
the hot path's) and by redis-py (``pyredis.py``); ``encoding.py`` writes RESP; ``errors.py``
says what a failure means (outage or refusal, and which store error); ``keys.py`` holds the
hash-tag rule that keeps a tenant's keys in one Cluster slot.

The stores (``quota/``, ``ledger/``, ``auth/`` keys, ``batch/`` state) import from here and
from nothing else of Redis but redis-py's exception classes.
"""

from __future__ import annotations

from gateway.redis.base import Command, RedisLike
from gateway.redis.client import Timeouts, open_redis, open_redis_py
from gateway.redis.encoding import array_head, bulk, decode_command, encode_command
from gateway.redis.errors import FAILURES, ErrorKind, ErrorMap, is_no_script, is_outage, kind_of
from gateway.redis.keys import InvalidTag, escape_tag, hash_tag
from gateway.redis.pipelined import PipelinedRedis
from gateway.redis.pyredis import PyRedis

__all__ = [
    "FAILURES",
    "Command",
    "ErrorKind",
    "ErrorMap",
    "InvalidTag",
    "PipelinedRedis",
    "PyRedis",
    "RedisLike",
    "Timeouts",
    "array_head",
    "bulk",
    "decode_command",
    "encode_command",
    "escape_tag",
    "hash_tag",
    "is_no_script",
    "is_outage",
    "kind_of",
    "open_redis",
    "open_redis_py",
]
