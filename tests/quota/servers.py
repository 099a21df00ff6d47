"""Redis servers for the quota tests (shared with the ledger tests: ``tests/redis_servers.py``)."""

from __future__ import annotations

from tests.redis_servers import RedisCluster3, RedisProc, free_port

__all__ = ["RedisCluster3", "RedisProc", "free_port"]
