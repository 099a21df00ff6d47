"""What prefix-cache-aware routing costs the gateway per request, in µs per 1,000 prompt tokens.

``python -m loadtest.bench.prefix_cost_bench [--repeat 200] [--block-bytes 256]``

For multi-turn chat prompts of ~1k, ~4k, ~16k and ~64k tokens (a system prompt, then turns
re-sending their history), times in this process:

- ``hash``: :func:`gateway.routing.prefix.prompt_hashes` (the JSON of the prompt fields, then the
  chained chunk hashes), done once per request in ``Router.route_request``;
- ``lookup``: the index's ``depths`` walk plus ``pick_prefix`` over 4 backends;
- ``record``: marking the chunks against the backend picked (at the pick, so per request too);
- ``total``: all three, against the bound of issue #18 (<= 20 µs per 1,000 prompt tokens).

The index is warm: every earlier turn of the conversation was recorded, as in a chat workload,
and filled to its ``max_entries`` with other prompts so eviction runs too. Tokens are counted
with the o200k_base tokenizer as the gateway counts chat prompts. Medians of ``--repeat`` runs;
prints a markdown table and writes JSON to ``loadtest/results/prefix-cost.json``. A
micro-benchmark of one internal module (the rest of ``loadtest/`` talks HTTP).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from gateway.config import Backend, Pool
from gateway.config.model import PrefixRouting
from gateway.routing.pick import pick_prefix
from gateway.routing.pool import PoolState
from gateway.routing.prefix import prompt_hashes
from gateway.tokenizers import count_chat_prompt

ROOT = Path(__file__).resolve().parents[2]
_SENTENCE = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
             "boxing matches near the old river bank and count their golden coins")
WORDS = tuple(_SENTENCE.split(" "))


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def conversation(rng: random.Random, target_tokens: int) -> list[dict[str, str]]:
    """Chat messages of about ``target_tokens``: a ~1,500-token system prompt (less for the
    smallest size), then user/assistant turns."""
    system = min(1500, target_tokens // 2)
    messages = [{"role": "system", "content": _text(rng, system)}]
    while count_chat_prompt(messages) < target_tokens:
        messages.append({"role": "user", "content": _text(rng, 60)})
        messages.append({"role": "assistant", "content": _text(rng, 200)})
    messages.append({"role": "user", "content": _text(rng, 40)})
    return messages


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def measure(target: int, repeat: int, settings: PrefixRouting, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    messages = conversation(rng, target)
    tokens = count_chat_prompt(messages)
    payload = {"model": "m", "messages": messages, "max_tokens": 100}
    pool = PoolState(Pool(name="bench", strategy="prefix", prefix=settings, backends=[
        Backend(url=f"http://b{i}", max_in_flight=1_000_000) for i in range(4)]))
    index = pool.prefix_index
    assert index is not None
    # warm: fill the index with other prompts, then the conversation's earlier turns
    filler = 0
    while len(index) < settings.max_entries:
        other = {"messages": [{"role": "user", "content": f"{filler} " + _text(rng, 400)}]}
        index.record(pool.backends[filler % 4], prompt_hashes(other, settings.block_bytes))
        filler += 1
    for cut in range(2, len(messages), 2):
        index.record(pool.backends[1], prompt_hashes({"messages": messages[:cut]},
                                                     settings.block_bytes))
    hash_s: list[float] = []
    lookup_s: list[float] = []
    record_s: list[float] = []
    clock = time.perf_counter
    backends = pool.backends
    for _ in range(repeat):
        t0 = clock()
        hashes = prompt_hashes(payload, settings.block_bytes)
        t1 = clock()
        depths = index.depths(hashes)
        picked = pick_prefix(backends, functools.partial(index.depth_of, depths),
                             settings.bounded_load, pool._rng)
        t2 = clock()
        assert picked is not None
        index.record(picked, hashes)
        t3 = clock()
        hash_s.append(t1 - t0)
        lookup_s.append(t2 - t1)
        record_s.append(t3 - t2)
    per_k = 1000 / tokens
    row = {
        "prompt_tokens": tokens,
        "prompt_bytes": len(json.dumps(messages)),
        "chunks": len(hashes),
        "matched_chunks": index.depth_of(index.depths(hashes), backends[1]),
        "hash_us": _median_us(hash_s),
        "lookup_us": _median_us(lookup_s),
        "record_us": _median_us(record_s),
    }
    row["total_us"] = row["hash_us"] + row["lookup_us"] + row["record_us"]
    for key in ("hash", "lookup", "record", "total"):
        row[f"{key}_us_per_1k_tokens"] = row[f"{key}_us"] * per_k
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.prefix_cost_bench",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=200, help="runs per prompt size (200)")
    p.add_argument("--block-bytes", type=int, default=PrefixRouting().block_bytes)
    p.add_argument("--max-entries", type=int, default=PrefixRouting().max_entries)
    p.add_argument("--sizes", default="1000,4000,16000,64000", help="prompt sizes, tokens")
    p.add_argument("--bound", type=float, default=20.0, help="µs per 1,000 tokens (20)")
    p.add_argument("--out", type=Path, default=ROOT / "loadtest/results/prefix-cost.json")
    args = p.parse_args(argv)
    settings = PrefixRouting(block_bytes=args.block_bytes, max_entries=args.max_entries)
    rows = [measure(int(s), args.repeat, settings, i) for i, s in enumerate(args.sizes.split(","))]
    load = os.getloadavg()
    print(f"\nprefix routing cost, block {args.block_bytes} B, index {args.max_entries} entries"
          f" (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})\n")
    print("| prompt tokens | chunks | hash µs | lookup+pick µs | record µs | total µs "
          "| µs per 1,000 tokens (hash / lookup / record / total) |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['prompt_tokens']:,} | {r['chunks']} | {r['hash_us']:.1f} | "
              f"{r['lookup_us']:.1f} | {r['record_us']:.1f} | {r['total_us']:.1f} | "
              f"{r['hash_us_per_1k_tokens']:.2f} / {r['lookup_us_per_1k_tokens']:.2f} / "
              f"{r['record_us_per_1k_tokens']:.2f} / **{r['total_us_per_1k_tokens']:.2f}** |")
    worst = max(r["total_us_per_1k_tokens"] for r in rows)
    verdict = "PASS" if worst <= args.bound else "FAIL"
    print(f"\n- {verdict} worst {worst:.2f} µs per 1,000 prompt tokens (bound {args.bound:g})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "load_average": load,
                                    "args": {k: str(v) for k, v in vars(args).items()}},
                                   indent=2))
    return 0 if worst <= args.bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
