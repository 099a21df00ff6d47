"""Benchmark of the accounting stage.

``python -m loadtest.bench.accounting_bench [--conversations N]``. Unlike the validation tool
(``loadtest/`` outside ``bench/``) this calls ``gateway.accounting`` directly: it measures CPU
per request in the library, not the gateway over HTTP.

1. Input split + count of a chat request at turn 1 and turn 50 of growing conversations
   (a system prompt, users writing 50-150 words a turn, the assistant 100-300). Each request is
   JSON-decoded before it is counted, as the proxy receives it, so no string hash is already
   cached. The cache is warm the way it is in service: every earlier request of the conversation
   was counted at its own turn. Rows:

   * ``proxy flow``: the proxy also counts each delivered reply into the cache at the end of its
     stream (``account_stream(..., remember_reply=True)``), so a request tokenises only the new
     user turn and hashes the rest.
   * ``no reply remembered``: the previous reply is tokenised at the next request.
   * ``no cache``: a cache too small to help; every message is tokenised every time.

   Conversations either share one system prompt (an application's, counted once) or each have
   their own (so turn 1 tokenises it).
2. The SSE scanner over a 64-event chat stream (one event per chunk, as backends write them, and
   re-chunked at random 1-200 byte boundaries), with and without stripping the usage event.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import msgspec

from gateway.accounting import PromptCounter, StreamScanner

__all__ = ["main"]

_COMMON_TEXT = (
    "the of and to in is that it for was on are as with be at by this have from or one had not "
    "but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read last "
    "request gateway tokens latency cluster deployment kubernetes configuration error retry"
)
_SYLLABLE_TEXT = "ka to ri mon sel var qui pen dra lo est ul bra cy ion ment ex zor"
_COMMON = _COMMON_TEXT.split()
_SYLLABLES = _SYLLABLE_TEXT.split()


def _vocabulary(rng: random.Random) -> list[str]:
    rare = ["".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4))) for _ in range(400)]
    return _COMMON * 4 + rare  # ~85% common words, the rest rarer multi-token words


def _prose(rng: random.Random, vocab: list[str], words: int) -> str:
    out: list[str] = []
    sentence = 0
    for _ in range(words):
        word = rng.choice(vocab)
        out.append(word.capitalize() if sentence == 0 else word)
        sentence += 1
        if sentence > rng.randint(8, 20):
            out[-1] += rng.choice(".....?!")
            sentence = 0
        elif rng.random() < 0.06:
            out[-1] += ","
    return " ".join(out) + "."


def _conversation(rng: random.Random, vocab: list[str], turns: int, system: str) -> list[Any]:
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for _ in range(turns):
        messages.append({"role": "user", "content": _prose(rng, vocab, rng.randint(50, 150))})
        messages.append({"role": "assistant", "content": _prose(rng, vocab, rng.randint(100, 300))})
    return messages


def bench_split(
    conversations: int, turns: int, *, remember: bool, cache: bool, shared_system: bool, seed: int
) -> dict[int, list[float]]:
    """µs per count_chat call, by turn, over ``conversations`` walked in lockstep."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    shared = _prose(rng, vocab, 150)
    convs = [
        _conversation(rng, vocab, turns, shared if shared_system else _prose(rng, vocab, 150))
        for _ in range(conversations)
    ]
    counter = PromptCounter("o200k_base", cache_size=200_000 if cache else 2)
    encode = msgspec.json.encode
    decode = msgspec.json.decode
    times: dict[int, list[float]] = {}
    for turn in range(1, turns + 1):
        row = times.setdefault(turn, [])
        for messages in convs:
            body = encode({"model": "m", "messages": messages[: 2 * turn]})
            payload = decode(body)  # what the proxy hands over: fresh strings, hashes not cached
            t0 = time.perf_counter_ns()
            counter.count_chat(payload)
            row.append((time.perf_counter_ns() - t0) / 1000)
            if remember:
                counter.remember_reply(messages[2 * turn]["content"])
    return times


def bench_decode(turns: int, seed: int) -> tuple[float, float, int]:
    """For scale: (µs to JSON-decode the turn-1 body, the last turn's body, its bytes)."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    messages = _conversation(rng, vocab, turns, _prose(rng, vocab, 150))
    out = []
    for turn in (1, turns):
        body = msgspec.json.encode({"model": "m", "messages": messages[: 2 * turn]})
        samples = []
        for _ in range(200):
            t0 = time.perf_counter_ns()
            msgspec.json.decode(body)
            samples.append((time.perf_counter_ns() - t0) / 1000)
        out.append(statistics.median(samples))
    return out[0], out[1], len(body)


def _stream(tokens: int, rng: random.Random) -> bytes:
    head = (
        b'data: {"id":"chatcmpl-AbC123","object":"chat.completion.chunk","created":1730000000,'
        b'"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":['
    )
    tail = b',"usage":null}\n\n'
    events = [
        head + b'{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]' + tail
    ]
    vocab = _vocabulary(rng)
    for _ in range(tokens):
        word = msgspec.json.encode(" " + rng.choice(vocab))
        events.append(
            head + b'{"index":0,"delta":{"content":' + word + b'},"logprobs":null,'
            b'"finish_reason":null}]' + tail
        )
    events.append(head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]' + tail)
    events.append(
        head + b'],"usage":{"prompt_tokens":1200,"completion_tokens":61,"total_tokens":1261,'
        b'"prompt_tokens_details":{"cached_tokens":1024},'
        b'"completion_tokens_details":{"reasoning_tokens":0}}}\n\n'
    )
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def _rechunk(data: bytes, rng: random.Random) -> list[bytes]:
    chunks = []
    i = 0
    while i < len(data):
        n = rng.randint(1, 200)
        chunks.append(data[i : i + n])
        i += n
    return chunks


def bench_sse(repeats: int, *, strip: bool, random_chunks: bool, seed: int) -> tuple[float, int]:
    """(median µs per stream, chunks per stream) for a 64-event stream."""
    rng = random.Random(seed)
    data = _stream(61, rng)
    if random_chunks:
        chunks = _rechunk(data, rng)
    else:
        chunks = [event + b"\n\n" for event in data.split(b"\n\n")[:-1]]
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        scanner = StreamScanner(strip_usage=strip)
        for chunk in chunks:
            scanner.feed(chunk)
        scanner.flush()
        samples.append((time.perf_counter_ns() - t0) / 1000)
        assert scanner.usage is not None and scanner.done
    return statistics.median(samples), len(chunks)


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.accounting_bench",
                                description=__doc__)
    p.add_argument("--conversations", type=int, default=100, help="conversations per row (100)")
    p.add_argument("--turns", type=int, default=50, help="turns per conversation (50)")
    p.add_argument("--streams", type=int, default=2000, help="SSE streams per row (2000)")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    last = args.turns

    print(f"split+count per chat request, µs (median / p90), {args.conversations} conversations")
    print(
        f"{'system prompt':<14} {'cache':<22} {'turn 1':>15} {'turn ' + str(last):>15} {'ratio':>6}"
    )
    for shared in (False, True):
        for label, remember, cache in (
            ("proxy flow", True, True),
            ("no reply remembered", False, True),
            ("no cache", False, False),
        ):
            t = bench_split(
                args.conversations,
                last,
                remember=remember,
                cache=cache,
                shared_system=shared,
                seed=args.seed,
            )
            first, final = t[1], t[last]
            m1, mn = statistics.median(first), statistics.median(final)
            print(
                f"{'shared' if shared else 'per conv.':<14} {label:<22} "
                f"{m1:>7.1f} / {_pct(first, 0.9):>5.1f} {mn:>7.1f} / {_pct(final, 0.9):>5.1f} "
                f"{mn / m1:>6.2f}"
            )

    d1, dn, size = bench_decode(last, args.seed)
    print(
        f"for scale, the proxy's own msgspec decode of the body: turn 1 {d1:.1f} µs, "
        f"turn {last} {dn:.1f} µs ({size // 1024} KiB)"
    )

    print(f"\nSSE scanner, 64-event chat stream, µs per stream (median of {args.streams})")
    print(f"{'chunking':<26} {'chunks':>6} {'pass-through':>13} {'strip usage':>12}")
    for random_chunks in (False, True):
        row = []
        for strip in (False, True):
            us, n = bench_sse(
                args.streams, strip=strip, random_chunks=random_chunks, seed=args.seed
            )
            row.append(us)
        name = "random 1-200 B" if random_chunks else "one event per chunk"
        print(f"{name:<26} {n:>6} {row[0]:>13.1f} {row[1]:>12.1f}")


if __name__ == "__main__":
    main()
