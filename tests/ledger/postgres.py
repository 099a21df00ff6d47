"""The PostgreSQL server the ledger tests start (one class with the benchmarks, which cannot
import the tests: it lives in ``loadtest/bench/pgserver.py``).

``PostgresServer`` is used like ``RedisProc``: ``start()``, ``url``, ``stop()`` (fast
shutdown), ``start()`` again on the same port and data, ``kill()`` (SIGKILL: crash recovery on
the next start), ``close()`` (removes its directory). Never the machine's own PostgreSQL.
"""

from __future__ import annotations

from loadtest.bench.pgserver import (
    PostgresError,
    PostgresNotFound,
    PostgresServer,
    find_bindir,
    free_port,
)

__all__ = ["PostgresError", "PostgresNotFound", "PostgresServer", "find_bindir", "free_port"]
