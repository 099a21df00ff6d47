"""What two worker processes on one core cost each other, without a socket or a shared lock.

``python -m loadtest.bench.overhead.interleave [--cpu 0] [--batches 1,4,16,64]``

``ab --b-workers 2`` puts both workers of a gateway on the proxy core, and finds more CPU per
request than one worker spends there. The workers share nothing but the listening socket and
their own connections to Redis and PostgreSQL, so the question is whether two interpreters
taking turns on one core cost more per unit of work than one, whatever the gateway does. This
runs the gateway's own request code in-process (``loadtest.bench.overhead.translation``'s six
paths in turn: chat, Messages and Responses, whole and streamed; one *unit* is one of each) in
two set-ups, both pinned to ``--cpu``:

- ``alone``: one work process and an echo process (a loop that reads a byte and writes it
  back): the work process runs ``k`` units, hands a byte to the echo, waits for it back;
- ``pair``: two work processes passing the byte between them after ``k`` units each.

Both set-ups block, wake and hand the core over once per ``k`` units, with the same pipe calls;
only in ``pair`` does the process that runs in between run the gateway's code too (a heap and
a working set of its own, as a second worker has). Each work process reads its own time on the
CPU from ``/proc/self/schedstat`` (nanoseconds, not ticks); the figure is CPU per unit, pair /
alone, the median of ``--repeat`` runs of each taken in turn. ``k`` sets how often the core
changes hands: the gateway's workers in ``ab`` do it about every 4-10 requests (0.1-0.25
voluntary context switches a request, ``ab``'s "per request" line).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = ["main"]

_APIS = ("chat", "messages", "responses")


def _units() -> list[Callable[[], object]]:
    """The six request paths of the translation bench: one unit is one call of each."""
    from gateway.accounting.split import PromptCounter
    from loadtest.bench.overhead.translation import paths

    counter = PromptCounter("o200k_base")
    return [paths(api, stream=stream, piece=0, counter=counter)
            for api in _APIS for stream in (False, True)]


def _on_cpu_ns() -> int:
    """This process's time on a CPU so far (all its threads), from the scheduler's books."""
    return sum(int(p.read_text().split()[0])
               for p in Path("/proc/self/task").glob("*/schedstat"))


def _run_units(fns: list[Callable[[], object]], k: int) -> None:
    for _ in range(k):
        for fn in fns:
            fn()


def _worker(cpu: int, k: int, rounds: int, first: Connection, recv: Connection,
            send: Connection, report: Connection) -> None:
    """A work process: ``rounds`` turns of ``k`` units, the first once ``first`` delivers a
    byte (the parent's start signal, or the other side's hand-over), the rest each after the
    byte comes back on ``recv``, passing it on after each; reports (ns on CPU, units)."""
    os.sched_setaffinity(0, {cpu})
    fns = _units()
    _run_units(fns, 20)  # warm: imports, caches, the tokenizer's first calls
    began = _on_cpu_ns()  # waiting for a byte costs no CPU
    report.send_bytes(b"ready")
    for turn in range(rounds):
        (recv if turn else first).recv_bytes()
        _run_units(fns, k)
        send.send_bytes(b".")
    report.send((_on_cpu_ns() - began, rounds * k))


def _echo(cpu: int, rounds: int, recv: Connection, send: Connection,
          report: Connection) -> None:
    """Hand the byte back ``rounds`` times: a process with next to no working set."""
    os.sched_setaffinity(0, {cpu})
    report.send_bytes(b"ready")
    for _ in range(rounds):
        send.send_bytes(recv.recv_bytes())


def _once(ctx: Any, mode: str, cpu: int, k: int, rounds: int) -> float:
    """One run of ``mode``: the work processes' CPU ns per unit."""
    a_to_b_r, a_to_b_w = ctx.Pipe(duplex=False)
    b_to_a_r, b_to_a_w = ctx.Pipe(duplex=False)
    start_r, start_w = ctx.Pipe(duplex=False)
    reports = []
    procs = []
    rep_r, rep_w = ctx.Pipe(duplex=False)
    reports.append(rep_r)
    # the first work process; its first turn waits for the parent's start signal
    procs.append(ctx.Process(target=_worker, args=(cpu, k, rounds, start_r, b_to_a_r,
                                                   a_to_b_w, rep_w)))
    rep2_r, rep2_w = ctx.Pipe(duplex=False)
    if mode == "pair":
        reports.append(rep2_r)
        procs.append(ctx.Process(target=_worker, args=(cpu, k, rounds, a_to_b_r, a_to_b_r,
                                                       b_to_a_w, rep2_w)))
    else:
        procs.append(ctx.Process(target=_echo, args=(cpu, rounds, a_to_b_r, b_to_a_w,
                                                     rep2_w)))
    for p in procs:
        p.start()
    try:
        for r in (rep_r, rep2_r):
            r.recv_bytes()  # both set up and warm
        start_w.send_bytes(b"go")
        results = [r.recv() for r in reports]
        for p in procs:
            p.join(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    ns: int = sum(r[0] for r in results)
    units: int = sum(r[1] for r in results)
    return ns / units


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.overhead.interleave",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", type=int, default=0, help="the core both set-ups run on (0)")
    p.add_argument("--batches", default="1,4,16,64",
                   help="units per turn, comma-separated (1,4,16,64)")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="about how long each run's work takes (2)")
    p.add_argument("--repeat", type=int, default=5, help="runs of each set-up per batch (5)")
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error("--batches: comma-separated integers")
    if min(args.batches) < 1 or args.repeat < 1 or args.seconds <= 0:
        p.error("--batches >= 1, --repeat >= 1, --seconds > 0")
    if args.cpu not in os.sched_getaffinity(0):
        p.error(f"--cpu {args.cpu}: not a CPU this process may run on")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fns = _units()  # this process times a unit only to size the runs: it stays unpinned
    _run_units(fns, 20)
    began = time.process_time()
    _run_units(fns, 100)
    unit_s = (time.process_time() - began) / 100
    print(f"[interleave] one unit (six request paths) {unit_s * 1e6:.0f} µs in this process",
          flush=True)
    ctx = mp.get_context("spawn")  # as uvicorn starts its workers: nothing shared by fork
    print("\n| units per turn | alone µs/unit | pair µs/unit | pair / alone (runs) |")
    print("|---:|---:|---:|---|")
    for k in args.batches:
        rounds = max(2, int(args.seconds / (unit_s * k)))
        alone, pair = [], []
        for _ in range(args.repeat):
            alone.append(_once(ctx, "alone", args.cpu, k, rounds))
            pair.append(_once(ctx, "pair", args.cpu, k, rounds // 2 or 1))
        ratios = ", ".join(f"{p / a:.3f}" for a, p in zip(alone, pair, strict=True))
        a_med, p_med = statistics.median(alone), statistics.median(pair)
        print(f"| {k} | {a_med / 1e3:.1f} | {p_med / 1e3:.1f} | **{p_med / a_med:.3f}** "
              f"({ratios}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
