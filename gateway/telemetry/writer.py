"""A line writer that keeps blocking writes off the event loop.

``write`` appends bytes (one line, or a batch of lines with their count) to a deque (no
syscall); a daemon thread writes what has gathered every ``interval`` seconds, or sooner when
``max_pending`` lines wait, in one ``write`` call. Past ``hard_limit`` pending lines (stdout
blocked for long) new lines are dropped and counted, and a line reporting the drop is written
once stdout moves again, so a stuck log consumer never stalls requests or fills memory.
"""

from __future__ import annotations

import atexit
import threading
from collections import deque
from typing import IO

__all__ = ["LineWriter"]


class LineWriter:
    """File-like enough for structlog's ``BytesLogger`` (``write`` and ``flush``)."""

    def __init__(self, stream: IO[bytes], *, interval: float = 0.05, max_pending: int = 512,
                 hard_limit: int = 100_000) -> None:
        self._stream = stream
        self._interval = interval
        self._max_pending = max_pending
        self._hard_limit = hard_limit
        self._pending: deque[bytes] = deque()  # append/popleft are thread-safe
        self._pending_lines = 0  # updated under _count_lock (writes are whole batches)
        self._count_lock = threading.Lock()
        self._dropped = 0
        self._wake = threading.Event()
        self._closed = False
        self._io_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __repr__(self) -> str:
        return f"<LineWriter [pending: {len(self._pending)} | dropped: {self._dropped}]>"

    def write(self, line: bytes, lines: int = 1) -> None:
        """Queue one line, or ``lines`` lines in one bytes object (each ends with a newline)."""
        with self._count_lock:
            if self._pending_lines + lines > self._hard_limit:
                self._dropped += lines
                return
            self._pending_lines += lines
            self._pending.append(line)
            full = self._pending_lines >= self._max_pending
        if full:
            self._wake.set()

    def flush(self) -> None:
        """No-op on the hot path: the thread flushes. Use :meth:`drain` to force."""

    def drain(self) -> None:
        """Write everything queued now, from the calling thread."""
        with self._io_lock:
            queue, pending = self._pending, []
            with self._count_lock:
                for _ in range(len(queue)):
                    pending.append(queue.popleft())
                self._pending_lines = 0
                dropped, self._dropped = self._dropped, 0
            if dropped:
                pending.append(b'{"event":"log_lines_dropped","level":"warning","count":%d}\n'
                               % dropped)
            if pending:
                try:
                    self._stream.write(b"".join(pending))
                    self._stream.flush()
                except (OSError, ValueError):  # closed or broken stdout: nothing to do
                    pass

    def close(self) -> None:
        """Stop the thread and write what is left; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=2.0)
        self.drain()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            self.drain()
