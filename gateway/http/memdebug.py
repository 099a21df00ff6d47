"""An opt-in memory dump of a worker, for finding what a stream's teardown leaves behind.

Off unless ``GATEWAY_MEMDEBUG`` names a file. Then, when the native server protocol makes its
first connection on a loop, :func:`install` adds a ``SIGUSR2`` handler that appends a report to
the file. With ``GATEWAY_MEMDEBUG_MODE=light`` the report is one JSON line, cheap enough for
tests: the cyclic garbage a full collection finds (by type, with ``gc.DEBUG_SAVEALL``: what
reference counting did not free), live objects made since start-up by type, asyncio tasks by
coroutine, fds, and RSS before and after collecting and after ``malloc_trim``. Otherwise
``tracemalloc`` is started (``GATEWAY_MEMDEBUG_FRAMES`` frames a trace, default 8) and each
report is text:

* the top allocation sites by growth since the previous dump (``tracemalloc`` snapshot diff,
  grouped by traceback), and by size now;
* live objects by type (``gc.get_objects``), with the change since the previous dump;
* the asyncio tasks alive on the loop, by coroutine name;
* RSS before and after ``malloc_trim(0)`` (glibc): memory that trimming gives back was free
  but held by the allocator (fragmentation), not a leak.

All of it is slow (tracemalloc roughly doubles the cost of every allocation), which is why it
is an environment switch for a bench run and never on in production.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os
import signal
import time
import tracemalloc
from collections import Counter
from pathlib import Path

__all__ = ["ENV", "collect_garbage", "install", "object_counts"]

ENV = "GATEWAY_MEMDEBUG"
_FRAMES_ENV = "GATEWAY_MEMDEBUG_FRAMES"
_MODE_ENV = "GATEWAY_MEMDEBUG_MODE"
_TOP = 25


class _Dumper:
    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self.loop = loop
        self.snapshot: tracemalloc.Snapshot | None = None
        self.types: Counter[str] = Counter()

    def light(self) -> None:
        """One JSON line: what a full collection finds as cyclic garbage (by type), live
        objects made since start-up by type, asyncio tasks, RSS at each step (no tracemalloc)."""
        rss = _rss_kib()
        garbage = collect_garbage()
        collected = _rss_kib()
        live = object_counts()
        tasks = Counter(_task_name(t) for t in asyncio.all_tasks(self.loop))
        trimmed = _malloc_trim()
        report = {
            "time": time.time(), "rss_kib": rss, "garbage": dict(garbage),
            "rss_collected_kib": collected, "rss_trimmed_kib": _rss_kib(), "trimmed": trimmed,
            "live": dict(live.most_common(60)), "tasks": dict(tasks),
            "fds": len(os.listdir("/proc/self/fd")),
        }
        with self.path.open("a") as out:
            out.write(json.dumps(report) + "\n")

    def dump(self) -> None:
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),))
        lines = [f"=== dump at {time.strftime('%H:%M:%S')} pid {os.getpid()}"]
        traced, peak = tracemalloc.get_traced_memory()
        lines.append(f"tracemalloc: {traced / 1024:.0f} KiB traced, peak {peak / 1024:.0f} KiB")
        if self.snapshot is not None:
            lines.append("-- growth since the last dump, by traceback")
            for stat in snap.compare_to(self.snapshot, "traceback")[:_TOP]:
                lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
                lines.extend("      " + line for line in stat.traceback.format()[-8:])
        lines.append("-- largest sites now, by line")
        for now in snap.statistics("lineno")[:_TOP]:
            lines.append(f"{now.size / 1024:9.1f} KiB {now.count:7d} blocks  {now.traceback}")
        self.snapshot = snap
        types = object_counts()
        lines.append("-- live objects by type (change since the last dump)")
        for name, count in types.most_common(40):
            lines.append(f"{count:9d} {count - self.types.get(name, 0):+8d}  {name}")
        self.types = types
        tasks = Counter(_task_name(t) for t in asyncio.all_tasks(self.loop))
        lines.append(f"-- asyncio tasks: {sum(tasks.values())}")
        lines.extend(f"{n:9d}  {name}" for name, n in tasks.most_common(15))
        before = _rss_kib()
        trimmed = _malloc_trim()
        lines.append(f"-- RSS {before} KiB, after malloc_trim {_rss_kib()} KiB "
                     f"(trim {'released memory' if trimmed else 'released nothing'})")
        with self.path.open("a") as out:
            out.write("\n".join(lines) + "\n")


def _task_name(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", type(coro).__name__)


def object_counts() -> Counter[str]:
    """Live gc-tracked objects by type name (after a collection)."""
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


def collect_garbage() -> Counter[str]:
    """Collect cyclic garbage, and say what it was: objects by type that only a collection
    (not reference counting) would free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = Counter(type(o).__name__ for o in gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    gc.collect()
    return found


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_libc: list[ctypes.CDLL] = []


def _malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: free memory the allocator holds goes back to the system."""
    if not _libc:
        try:
            _libc.append(ctypes.CDLL("libc.so.6"))
        except OSError:
            return False
    return bool(_libc[0].malloc_trim(0))


_installed: set[int] = set()


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Start tracing and the ``SIGUSR2`` dump if ``GATEWAY_MEMDEBUG`` is set (once a process)."""
    target = os.environ.get(ENV)
    if not target or os.getpid() in _installed:
        return
    _installed.add(os.getpid())
    light = os.environ.get(_MODE_ENV, "") == "light"
    if not light:
        tracemalloc.start(int(os.environ.get(_FRAMES_ENV, "8")))
    dumper = _Dumper(Path(target), loop)
    loop.add_signal_handler(signal.SIGUSR2, dumper.light if light else dumper.dump)
