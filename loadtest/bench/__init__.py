"""Benchmarks of the gateway, run from a checkout, not part of the validation tool.

``python -m loadtest`` (the validation tool, the rest of ``loadtest/``) talks HTTP only and can
be pointed at any OpenAI-compatible endpoint. The modules here measure this gateway itself:
some call its internals directly (``accounting_bench``, ``ledger_bench``, ``quota_bench``,
``telemetry_bench``: CPU or Redis cost of one stage, without the HTTP hop; ``ledger_drivers``:
asyncpg against psycopg 3 on the ledger's PostgreSQL write path), the others start
``gateway serve`` and simulated engines and drive them over HTTP (``overhead``,
``routing_bench``, ``batch_bench``, ``loop_stall``, ``redis_cost``). ``fastserver`` is the
trivial SSE target that measures the validation tool's own ceiling; ``redis_local`` starts a
throwaway redis-server for the benchmarks that need one, ``pgserver`` a throwaway PostgreSQL
(the tests use it too). Run each with
``python -m loadtest.bench.<name> --help``.
"""

__all__: list[str] = []
