"""Where a translated request's CPU goes: the translation steps timed and profiled in-process.

``python -m loadtest.bench.overhead.translation`` runs, in this process and without sockets,
the steps in which a Messages or Responses request to a chat-only backend differs from a chat
completion of the same content (the overhead bench's request and fixture answers):

* ``chat``: the chat request parsed (``parse_request``); a stream is read by the usage
  scanner (``StreamScanner``) as the relay reads it;
* ``messages`` / ``responses``: the request decoded, checked and translated
  (``parse_translated``), the chat body encoded for the backend, the prompt counted for a
  stream that reports input tokens up front (Messages' ``message_start``; not Responses), and
  the answer translated back
  (``Upstream.answer``), or the stream through ``TranslatingScanner`` (the usage scanner, then
  the front-end's ``StreamTranslator``).

It prints the µs per request of each path (median of ``--repeat`` timings of ``--number``
runs), the difference to chat, and with ``--profile`` the top functions of a cProfile run of
the translated path (tottime), to set against the gateway's CPU per request measured by
``loadtest.bench.overhead.ab``. The stream is fed one event per read (``--piece 0``, the
default: how a backend writes a stream), as one read (``--piece 65536``: the fixture is ~12 KB)
or in ``--piece``-byte reads.

Instructions instead of time: ``--calls N --only API --mode stream`` runs N requests of one
path and prints nothing, for ``valgrind --tool=callgrind`` (instructions are immune to the
machine's load); two runs, N=20 and N=120, give the instructions per request as the difference
of their totals over 100 (the start-up cancels out)::

    valgrind --tool=callgrind --callgrind-out-file=cg.20 \
        python -m loadtest.bench.overhead.translation --calls 20 --only responses --mode stream
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import msgspec

from gateway.accounting import StreamScanner
from gateway.accounting.meter import count_prompt
from gateway.accounting.split import PromptCounter
from gateway.dialects.chat.parse import parse_request
from gateway.dialects.plan import Upstream
from gateway.dialects.registry import FRONTENDS, parse_translated
from gateway.dialects.shape import ENDPOINTS
from gateway.dialects.translated_stream import TranslatingScanner

from . import payloads

__all__ = ["main", "paths"]

_encode = msgspec.json.encode


def _reads(sse: bytes, piece: int) -> list[bytes]:
    """The stream as the relay reads it: one event per read (``piece`` 0) or ``piece`` bytes."""
    if piece <= 0:
        return [event + b"\n\n" for event in sse.split(b"\n\n") if event]
    return [sse[i:i + piece] for i in range(0, len(sse), piece)]


def _feed(scanner: StreamScanner | TranslatingScanner, reads: list[bytes]) -> int:
    sent = sum(len(scanner.feed(read)) for read in reads)
    return sent + len(scanner.flush())


def paths(api: str, *, stream: bool, piece: int, counter: PromptCounter
          ) -> Callable[[], object]:
    """One request's gateway-side work of ``api`` that differs between the paths."""
    body = payloads.request_body(stream=stream, api=api).encode()
    answer = payloads.completion_body().encode()
    reads = _reads(payloads.sse_body().encode(), piece)
    if api == "chat":
        endpoint = ENDPOINTS[payloads.API_PATHS["chat"]]

        def chat() -> object:
            parsed = parse_request(body, endpoint)
            if stream:
                return _feed(StreamScanner(strip_usage=True), reads)
            return parsed

        return chat
    frontend = FRONTENDS[api]

    def translated() -> object:
        parsed, _ = parse_translated(body, frontend)
        chat = dict(parsed.payload)
        chat["model"] = parsed.model
        upstream = _encode(chat)
        if stream:
            # counted as the gateway counts it: only for a stream that reports it up front
            tokens = (count_prompt(counter, "chat", parsed.payload).total
                      if frontend.stream_counts_prompt else 0)
            translator = frontend.stream(model=parsed.model, request_id="req-bench",
                                         prompt_tokens=tokens, request=parsed.native)
            return _feed(TranslatingScanner(translator), reads)
        plan = Upstream(frontend, False, "/v1/chat/completions", upstream, None, None,
                        parsed.model, "req-bench", "openai", parsed.native)
        return plan.answer(200, answer)

    return translated


def _time(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Median CPU µs per call over ``repeat`` timings of ``number`` calls (CPU time, so a
    loaded machine slows it less than the wall clock)."""
    fn()
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            fn()
        runs.append((time.process_time() - start) / number * 1e6)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.overhead.translation",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=2000, help="calls per timing (2000)")
    p.add_argument("--repeat", type=int, default=7, help="timings per path (7)")
    p.add_argument("--piece", type=int, default=0,
                   help="bytes per stream read (0: one event per read; 65536: the whole "
                   "fixture at once)")
    p.add_argument("--profile", type=int, default=15, metavar="N",
                   help="show the top N functions of each translated path (0: none)")
    p.add_argument("--encoding", default="o200k_base",
                   help="the prompt counter's encoding (o200k_base, the models' default)")
    p.add_argument("--calls", type=int, default=None, metavar="N",
                   help="only run N requests of --only/--mode, untimed (for callgrind)")
    p.add_argument("--only", choices=["chat", *sorted(FRONTENDS)], default="chat",
                   help="the path --calls runs (chat)")
    p.add_argument("--mode", choices=["stream", "non-stream"], default="stream",
                   help="the mode --calls runs (stream)")
    args = p.parse_args(argv)
    counter = PromptCounter(args.encoding)
    if args.calls is not None:
        fn = paths(args.only, stream=args.mode == "stream", piece=args.piece, counter=counter)
        for _ in range(args.calls + 1):  # one more: the first call warms caches up
            fn()
        return 0
    for stream in (False, True):
        mode = "stream" if stream else "non-stream"
        base = _time(paths("chat", stream=stream, piece=args.piece, counter=counter),
                     args.number, args.repeat)
        print(f"\n{mode}: chat {base:.1f} µs per request")
        for api in sorted(FRONTENDS):
            fn = paths(api, stream=stream, piece=args.piece, counter=counter)
            us = _time(fn, args.number, args.repeat)
            extra = f", {(us - base) / payloads.STREAM_CHUNKS:.2f} µs more per chunk" \
                if stream else ""
            print(f"{mode}: {api} {us:.1f} µs per request, {us - base:+.1f} µs vs chat{extra}")
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.number):
                    fn()
                prof.disable()
                out = io.StringIO()
                stats = pstats.Stats(prof, stream=out)
                stats.sort_stats("tottime").print_stats(args.profile)
                print("\n".join(ln for ln in out.getvalue().splitlines()[6:] if ln.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
