"""A gateway stand-in for the crash tests: writes records until a signal stops it.

``python -m tests.ledger.worker URL SPOOL TENANT LOG [MODE]`` runs 16 writers, each writing
one record at a time with ``write_durable`` (MODE ``commit``, the default: the group commit the
pipeline uses before a response's last bytes) or ``write_journaled`` (MODE ``journal``: durable
in the local journal; ``journal-alone``: each written on the loop, as with one request in
flight) to the SQL ledger the URL names, and appends ``<request id>`` to LOG
once the write returned (an ``os.write`` per line: the page cache keeps it through a
SIGKILL), i.e. once a client would have had its answer. On SIGTERM it stops writing, closes
the ledger (the drain under test) and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from gateway.ledger import UsageRecord
from gateway.ledger.sql import open_ledger

WRITERS = 16


async def main(url: str, spool: str, tenant: str, log_path: str, mode: str = "commit") -> None:
    ledger = open_ledger(url, spool_dir=spool, migrate=True)
    await ledger.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def writer(w: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            rid = f"w{w}-{n}"
            record = UsageRecord(request_id=rid, ts_ms=time.time_ns() // 1_000_000,
                                 tenant=tenant, new=n, output=1, prompt_total=n)
            if mode.startswith("journal"):  # journal-alone: written on the loop
                await ledger.write_journaled(record, alone=mode == "journal-alone")
            else:
                await ledger.write_durable(record)
            os.write(fd, f"{rid}\n".encode())

    await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    await ledger.close()
    os.close(fd)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
