"""The PostgreSQL server the ledger tests start (one class with the benchmarks, which cannot
import the tests: it lives in ``loadtest/bench/pgserver.py``).

``PostgresServer`` is used like ``RedisProc``: ``start()``, ``url``, ``stop()`` (fast
shutdown), ``start()`` again on the same port and data, ``kill()`` (SIGKILL: crash recovery on
the next start), ``close()`` (removes its directory). Never the machine's own PostgreSQL.
"""

from __future__ import annotations

import pytest

from loadtest.bench.pgserver import (
    PostgresError,
    PostgresNotFound,
    PostgresServer,
    find_bindir,
)
from tests.process_marker import PROCESS

__all__ = ["SQL_DIALECTS", "PostgresError", "PostgresNotFound", "PostgresServer", "find_bindir"]

SQL_DIALECTS = ["sqlite", pytest.param("postgresql", marks=PROCESS)]
"""The params of a fixture that runs its tests on both SQL ledgers (the PostgreSQL one needs
the session's server: those tests start a process)."""
