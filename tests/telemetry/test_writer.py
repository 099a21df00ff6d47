"""The line writer: batches off the caller's thread, bounded, never loses order."""

from __future__ import annotations

import io
import json
import threading
import time

from gateway.telemetry.writer import LineWriter


def test_thread_flushes_without_close() -> None:
    buf = io.BytesIO()
    writer = LineWriter(buf, interval=0.01)
    writer.write(b"a\n")
    deadline = time.monotonic() + 2
    while buf.getvalue() != b"a\n" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert buf.getvalue() == b"a\n"
    writer.close()


def test_drops_past_hard_limit_and_says_so() -> None:
    """A stuck stdout fills the queue to hard_limit; later lines are dropped and counted."""

    class Stuck(io.BytesIO):
        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()

        def write(self, data: bytes) -> int:  # type: ignore[override]
            self.release.wait(5)
            return super().write(data)

    stream = Stuck()
    writer = LineWriter(stream, interval=10, max_pending=10**9, hard_limit=3)
    for i in range(5):
        writer.write(b"%d\n" % i)
    assert repr(writer) == "<LineWriter [pending: 3 | dropped: 2]>"
    stream.release.set()
    writer.close()
    out = stream.getvalue().splitlines()
    assert out[:3] == [b"0", b"1", b"2"]
    assert json.loads(out[3]) == {"event": "log_lines_dropped", "level": "warning", "count": 2}


def test_concurrent_writers_lose_nothing() -> None:
    buf = io.BytesIO()
    writer = LineWriter(buf, interval=0.001, max_pending=7)

    def produce(tag: int) -> None:
        for i in range(2000):
            writer.write(b"%d-%d\n" % (tag, i))

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    got = buf.getvalue().splitlines()
    assert len(got) == 8000
    for tag in range(4):
        mine = [g for g in got if g.startswith(b"%d-" % tag)]
        assert mine == [b"%d-%d" % (tag, i) for i in range(2000)]
