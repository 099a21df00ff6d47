"""Bytes on disk per usage record in PostgreSQL, for the sizing in deploy/README.md.

    PYTHONPATH=. python deploy/ledger_bytes.py [--records 100000] [--json out.json]

Starts a throw-away PostgreSQL (``loadtest.bench.pgserver.PostgresServer``: a temporary
cluster on a free loopback port, ``fsync`` on), migrates it, and writes ``--records`` records
through the gateway's own store (``PostgresLedger``: the insert that fills the day partitions
and the hourly rollups in one statement) in flushes of ``--batch`` records, as the gateway's
flusher does. Then ``VACUUM ANALYZE`` and ``pg_total_relation_size`` (heap, TOAST, every
index) of each ``usage_records`` partition and of ``usage_hourly``, divided by the records.
Also the WAL written (``pg_current_wal_lsn`` before and after the writes) per record.

The records look like the gateway's: request ids as ``gateway.context.new_request_id`` makes
them (a random 16-hex prefix per process and a counter; ``--processes`` writers interleaved, so
the primary key grows at that many points, as it does in production), completion times in order
over ``--hours`` hours ending now, ``--tenants`` tenants of ``--keys`` keys each, ``--models``
models, a tenth of them batch lines of one of ``--batches`` batch jobs, realistic token
counts, timings and cost lines. The rollup's share depends on how many distinct groups
(tenant, hour, key, model, class, version, batch) the records fall into, so it is reported
per rollup row as well: size the rollups by your own groups per hour, not by requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from gateway.ledger import LedgerSettings, UsageRecord
from gateway.ledger.sql.postgres import PostgresLedger
from loadtest.bench.pgserver import PostgresServer

__all__ = ["main", "make_records", "measure"]

_MODELS = [("llama-3.1-8b-chat", "meta-llama/Llama-3.1-8B-Instruct", "chat"),
           ("llama-3.1-70b-chat", "meta-llama/Llama-3.1-70B-Instruct", "chat-large"),
           ("gpt-4o-mini", "gpt-4o-mini-2024-07-18", "hosted"),
           ("qwen2.5-coder-32b", "Qwen/Qwen2.5-Coder-32B-Instruct", "code"),
           ("bge-m3-embed", "BAAI/bge-m3", "embed"),
           ("mistral-small-24b", "mistralai/Mistral-Small-24B-Instruct-2501", "chat")]


def make_records(n: int, *, tenants: int, keys: int, models: int, batches: int, hours: float,
                 processes: int, seed: int = 1) -> list[UsageRecord]:
    """``n`` records shaped like the gateway's, completion times in order over ``hours``."""
    rng = random.Random(seed)
    writers = [[rng.getrandbits(64), rng.getrandbits(32)] for _ in range(processes)]
    end_ms = int(time.time() * 1000)
    span_ms = int(hours * 3_600_000)
    used = _MODELS[:models]
    records = []
    for i in range(n):
        t = rng.randrange(tenants)
        model, upstream, pool = rng.choice(used)
        batch = rng.random() < 0.1
        system, history, new = rng.randint(20, 400), rng.randint(0, 3000), rng.randint(5, 600)
        cached = rng.randint(0, system + history)
        output = rng.randint(1, 800)
        prompt = system + history + new
        costs = [rng.randint(0, 20_000) for _ in range(4)]
        cost_output = rng.randint(0, 40_000)
        writer = rng.choice(writers)
        writer[1] += 1
        records.append(UsageRecord(
            request_id=f"{writer[0]:016x}{writer[1]:016x}",
            ts_ms=end_ms - span_ms + span_ms * i // n,
            tenant=f"tenant-{t:04d}",
            team=f"team-{t % 7}" if t % 3 else None,
            organization="org-main" if t % 3 else None,
            key_id=f"key_{t:04d}_{rng.randrange(keys)}",
            model=model, upstream_model=upstream,
            request_class="batch" if batch else "interactive",
            pool=f"{pool}-batch" if batch else pool,
            backend=f"{pool}-{rng.randrange(4)}",
            version=None,
            batch_id=f"batch_{rng.randrange(batches):024x}" if batch else None,
            attempts=1, status=200, outcome="completed",
            system=system, history=history, new=new, cached=cached, output=output,
            prompt_total=prompt, estimated=False,
            ttft_ms=rng.uniform(30, 900), tpot_ms=rng.uniform(8, 40),
            duration_ms=rng.uniform(200, 30_000),
            cost_micros=sum(costs) + cost_output, cost_system=costs[0], cost_history=costs[1],
            cost_new=costs[2], cost_cached=costs[3], cost_output=cost_output,
        ))
    return records


_SIZES = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0),
       coalesce(sum(pg_relation_size(c.oid)), 0)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'usage_records'
"""


async def measure(url: str, records: list[UsageRecord], batch: int, spool: Path,
                  checkpoint_every: int = 0) -> dict[str, Any]:
    """Write the records through ``PostgresLedger``, then measure the tables and the WAL
    (``checkpoint_every``: a CHECKPOINT after that many records, to count full-page writes)."""
    conn = await asyncpg.connect(url)
    try:
        ledger = PostgresLedger(url, spool_dir=spool, migrate=True,
                                settings=LedgerSettings(batch_size=batch))
        await ledger.start()
        wal_start = await conn.fetchval("SELECT pg_current_wal_lsn()")
        for i in range(0, len(records), batch):
            for record in records[i:i + batch]:
                ledger.write_nowait(record)
            await ledger.flush()
            if checkpoint_every and (i // batch + 1) * batch % checkpoint_every < batch:
                await conn.execute("CHECKPOINT")
        wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", wal_start)
        await ledger.close()
        assert ledger.stats.stored == len(records), ledger.stats  # nothing spooled
        await conn.execute("VACUUM ANALYZE")
        total, heap = (int(v) for v in await conn.fetchrow(_SIZES))
        stored = int(await conn.fetchval("SELECT count(*) FROM usage_records"))
        rollups = int(await conn.fetchval("SELECT count(*) FROM usage_hourly"))
        hourly = int(await conn.fetchval("SELECT pg_total_relation_size('usage_hourly')"))
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return {
        "postgresql": version, "records": stored, "flush_batch": batch,
        "records_bytes": total, "records_heap_bytes": heap,
        "records_bytes_per_record": total / stored,
        "records_heap_bytes_per_record": heap / stored,
        "rollup_rows": rollups, "rollup_bytes": hourly,
        "rollup_bytes_per_row": hourly / rollups,
        "bytes_per_record_all": (total + hourly) / stored,
        "wal_bytes": int(wal), "wal_bytes_per_record": float(wal) / stored,
        "checkpoint_every": checkpoint_every,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256, help="records per flush")
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--keys", type=int, default=3, help="keys per tenant")
    parser.add_argument("--models", type=int, default=4, choices=range(1, len(_MODELS) + 1))
    parser.add_argument("--batches", type=int, default=20, help="batch jobs in the period")
    parser.add_argument("--hours", type=float, default=1.0, help="the records' time span")
    parser.add_argument("--processes", type=int, default=6,
                        help="gateway processes writing (request id prefixes)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="a CHECKPOINT after every this many records (0: none)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    records = make_records(args.records, tenants=args.tenants, keys=args.keys,
                           models=args.models, batches=args.batches, hours=args.hours,
                           processes=args.processes)
    with PostgresServer() as server, tempfile.TemporaryDirectory() as spool:
        result = asyncio.run(measure(server.url, records, args.batch, Path(spool),
                                     args.checkpoint_every))
    result["workload"] = {k: v for k, v in vars(args).items() if k != "json"}
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
