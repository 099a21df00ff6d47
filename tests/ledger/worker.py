"""A gateway stand-in for the crash tests: writes records until a signal stops it.

``python -m tests.ledger.worker URL SPOOL TENANT LOG`` writes five records every 2 ms through
a ``RedisLedger`` and appends ``<request id> <CLOCK_MONOTONIC ns>`` to LOG after each
``write`` returns (an ``os.write`` per line: the page cache keeps it through a SIGKILL). On
SIGTERM it stops writing, closes the ledger (the drain under test) and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from gateway.ledger import RedisLedger, UsageRecord


async def main(url: str, spool: str, tenant: str, log_path: str) -> None:
    ledger = RedisLedger.from_url(url, spool_dir=spool, timeout=1.0)
    await ledger.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    n = 0
    while not stop.is_set():
        lines = []
        for _ in range(5):
            n += 1
            rid = f"w-{n}"
            record = UsageRecord(
                request_id=rid, ts_ms=time.time_ns() // 1_000_000, tenant=tenant, new=n, output=1
            )
            await ledger.write(record)
            lines.append(f"{rid} {time.monotonic_ns()}\n")
        os.write(fd, "".join(lines).encode())
        await asyncio.sleep(0.002)
    await ledger.close()
    os.close(fd)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
