"""A stream survives its engine: SIGKILL the llama-server serving a stream, at random points.

``python -m loadtest.bench.continuation_kill [--runs 100] [--max-tokens 160] [--no-timings]``
starts two
``llama-server`` replicas of the same tiny model file (``loadtest.engines``: 1 slot, 1 thread
each, ``--slot-save-path`` so a slot's cache can be erased), a ``gateway serve`` (one worker)
whose pool ``cont`` holds both (``engine: llamacpp``, ``continuation: {enabled: true}``, health
probes every 0.5 s so a restarted engine is taken back at once) and a SQLite ledger in the work
directory, priced ``input: 3``, ``output: 5`` (3 and 5 micro-units a token). Each run:

1. the prompt of the run (``Tell me a long story, number <i>.``) is answered by each engine
   directly, uninterrupted (the reference: one per replica; whether the two agree is reported),
   with both slots erased before and after, so every answer starts cold (the same arithmetic
   each time: a warm prompt cache changes the rounding, and a random model's near ties fall
   with it);
2. a streamed chat completion through the gateway (httpx, SSE read line by line): temperature
   0, ``seed`` 7, ``max_tokens`` (160), ``ignore_eos`` (every answer is that long),
   ``include_usage``, and llama.cpp's ``timings_per_token``, so every content chunk says which
   token of its engine's answer it is (``timings.predicted_n``): the continuation's chunks
   count from 1 again, which puts the seam exactly where it is without guessing (and the
   gateway reads the same count: the tokens sent, exactly). With ``--no-timings`` the
   gateway's request goes without it, as most clients send theirs (the gateway then counts
   a chunk a token): the seam is where the gateway's log line says the stream broke
   (``after N tokens``: N chunks), the tokens before it are the killed engine's unbroken
   answer's index of its N-th chunk, the continuation's are the final usage's output less N;
3. the gateway's ``/admin/stats``, polled on a thread as the request goes out, names the
   backend the request is in flight on (falling back to the engines' ``/slots``), while the
   client reads on; after ``k`` content chunks, ``k``
   uniform over ``1..max_tokens``, that engine is SIGKILLed (and reaped) while the client keeps
   reading to the end: a finish reason and ``[DONE]`` (whole) or an error event;
4. the killed engine is started again on its port and the run waits (20 s at most) for the
   gateway to count both backends healthy and idle; the run's usage record is read from the
   SQLite ledger by the gateway's ``x-request-id`` (15 s at most);
5. a continued run's continuation is asked again of the engine that wrote it, directly and cold
   (the prefix the client had as a final assistant message, ``continue_final_message``), for
   as many tokens: the engine's own completion of that prefix, to hold the seam against.

Judged per run (``judge``): **whole** (a finish reason, ``[DONE]``, no error event);
**continued** (the chunks' token index went back to 1: a second engine wrote the rest). A kill
that lands after the engine has sent its whole answer (the client reads behind the engine: on a
busy box, by tens of tokens at times) is *late*: the stream is whole with nothing to continue;
such a run is not one of the ``--runs``: it is run again with the next kill point, and counted
apart, as is one whose serving engine was not found. **Prefix OK**: the chunks before the seam
are the killed engine's unbroken answer's, text and token index alike. **Replayed**: the chunks
after it are, token for token, what the continuing engine writes when asked directly, cold, to
continue that prefix as the gateway asks (``continue_final_message``). **Seam OK**: both, and
the prefix not echoed: no token lost, repeated or skipped on the way. The first token after the
seam against the unbroken answer: ``exact``, or ``retokenised`` (another token, see below).
**Equal**: the whole text equals the continuing engine's unbroken answer. The **record**: rows
for the request id, counted after the gateway has stopped and flushed (1/0/2+); ``continued``,
the outcome, ``continuation_prompt`` > 0, ``output`` against the final usage chunk and against
the engine tokens the client received, ``prompt_total`` against the engine's prompt,
``cost_micros`` = 3 x ``prompt_total`` + 5 x ``output`` with ``continuation_cost`` = 3 x
``continuation_prompt`` kept out of it (billed once), and against what an unbroken stream of
the tokens the client received is billed; whether the record says ``estimated``; whether the
client received ``max_tokens`` engine tokens at most. An error event's cause is named when the
record shows the gateway counted the text sent at ``max_tokens`` or past it.

llama.cpp takes the continuation's prefill as text and tokenises it again; a random model's
tokens are often not the tokenizer's own split of their text, so the continuation's context is
other tokens than the unbroken answer's and its text drifts from it at once; where the tokens
are the same, the prefix is prefilled in one batch where the unbroken answer decoded it a token
at a time, and the rounding differs enough to flip a near tie some tokens later. That is
reported (``equal``, the first divergence), not hidden.

Prints the table and writes every run (texts, chunk indexes, the record) to ``--out``
(``loadtest/results/continuation-kill.json``). Engines and gateway are stopped at the end
whatever happened; their logs stay in ``--workdir`` (default: a new directory under /tmp).
Exit status 1 when fewer than ``--target`` (99 %) of the runs ended whole or a run had other
than one record, 2 when the bench could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtest.engines.build import require_server_binary
from loadtest.engines.llama_server import LlamaServer, free_port
from loadtest.engines.tiny_model import TinyModelSpec, tiny_model_path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "loadtest" / "results" / "continuation-kill.json"
ENGINE_MODEL = "tiny-llama"
MODEL = "tiny-cont"
POOL = "cont"
TENANT = "kill"
#: micro-units a token (prices are per million tokens: "3" = 3 micro-units a token)
PRICE_INPUT, PRICE_OUTPUT = 3, 5
NAMES = ("a", "b")
CLIENT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
READY_TIMEOUT = 20.0
CLOSE = {"Connection": "close"}
RECORD_TIMEOUT = 15.0
#: the gateway's log line of a continued stream: after how many tokens (chunks) it broke
_CONTINUED_AFTER = re.compile(r"stream broken on \S+ after (\d+) tokens .*continued on")


# -- one stream as a client reads it (pure) ---------------------------------------------------


@dataclass
class Chunk:
    """One content chunk: its text and, from llama.cpp's ``timings``, which token of its
    engine's answer it is (``n``) and that engine's prompt (``prompt_n`` + ``cache_n``)."""

    text: str
    n: int | None = None
    prompt_n: int | None = None
    cache_n: int | None = None


@dataclass
class Stream:
    """What a client got from one streamed chat completion."""

    status: int = 0
    request_id: str | None = None
    chunks: list[Chunk] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: Any = None
    done: bool = False
    roles: int = 0
    ids: set[str] = field(default_factory=set)
    models: set[str] = field(default_factory=set)
    #: the finish or usage chunk said ``"metadata": {"x-gateway-continued": "1"}``
    marked: bool = False
    #: a transport failure (the connection cut, a timeout) instead of an end
    transport: str | None = None
    body: str = ""

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def whole(self) -> bool:
        return (self.status == 200 and bool(self.finish_reasons) and self.done
                and self.error is None and self.transport is None)

    def feed(self, payload: str) -> None:
        """One ``data:`` payload, in order."""
        if payload == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            self.error = self.error or f"undecodable event: {payload[:200]}"
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.error = event["error"]
            return
        if isinstance(event.get("id"), str):
            self.ids.add(event["id"])
        if isinstance(event.get("model"), str):
            self.models.add(event["model"])
        if (event.get("metadata") or {}).get("x-gateway-continued") == "1":
            self.marked = True
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        timings = event.get("timings") or {}
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("role"):
                self.roles += 1
            if choice.get("finish_reason"):
                self.finish_reasons.append(choice["finish_reason"])
            if delta.get("content"):
                self.chunks.append(Chunk(delta["content"], timings.get("predicted_n"),
                                         timings.get("prompt_n"), timings.get("cache_n")))


def read_stream(client: httpx.Client, url: str, body: Mapping[str, Any],
                headers: Mapping[str, str] | None = None,
                on_content: Callable[[Stream], None] | None = None,
                on_open: Callable[[Stream], None] | None = None) -> Stream:
    """POST ``body`` as a streamed chat completion and read its SSE to the end; ``on_open``
    is called once the headers are in, ``on_content`` after each content chunk (the kill goes
    there)."""
    out = Stream()
    try:
        with client.stream("POST", url + "/v1/chat/completions", json=dict(body),
                           headers=dict(headers or {}), timeout=CLIENT_TIMEOUT) as r:
            out.status = r.status_code
            out.request_id = r.headers.get("x-request-id")
            if on_open is not None and r.status_code == 200:
                on_open(out)
            if r.status_code != 200:
                out.body = r.read().decode(errors="replace")[:2000]
                return out
            data: list[str] = []
            for line in r.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                    continue
                if line.strip() or not data:
                    continue  # a comment, a keep-alive, a field we do not read
                before = len(out.chunks)
                out.feed("\n".join(data))
                data = []
                if on_content is not None and len(out.chunks) > before:
                    on_content(out)
            if data:
                out.feed("\n".join(data))
    except httpx.HTTPError as exc:
        out.transport = f"{type(exc).__name__}: {exc}"
    return out


# -- judging one run (pure) --------------------------------------------------------------------


def split_at_seam(chunks: Sequence[Chunk]) -> tuple[list[Chunk], list[Chunk]]:
    """The chunks before and after the seam: where an engine's token index goes back (the
    continuation counts from 1 again); no seam: all of them before it."""
    for i in range(1, len(chunks)):
        a, b = chunks[i - 1].n, chunks[i].n
        if a is not None and b is not None and b <= a:
            return list(chunks[:i]), list(chunks[i:])
    return list(chunks), []


def tokens_of(chunks: Sequence[Chunk]) -> int:
    """The engine tokens these chunks of one engine's answer carry (the last one's index)."""
    return (chunks[-1].n or len(chunks)) if chunks else 0


def prompt_of(chunk: Chunk) -> int | None:
    """The prompt of the engine answer a chunk is part of (prefilled + read from its cache)."""
    if chunk.prompt_n is None:
        return None
    return chunk.prompt_n + (chunk.cache_n or 0)


def first_divergence(text: str, ref: str) -> int | None:
    """The first character where ``text`` and ``ref`` differ (None: equal)."""
    if text == ref:
        return None
    for i, (x, y) in enumerate(zip(text, ref, strict=False)):
        if x != y:
            return i
    return min(len(text), len(ref))


def seam_kind(before: Sequence[Chunk], after: Sequence[Chunk], ref: Sequence[Chunk]) -> str:
    """What the first token after the seam is, against the unbroken answer's chunks ``ref``:
    ``exact`` (the token the unbroken answer has there), ``echo`` (the continuation starts
    with the whole prefix again), ``repeated`` (the last token sent, again), ``skipped`` (the
    token after the one expected), ``retokenised`` (another token: the continuation's context
    is the prefix tokenised again), or ``none`` (no continuation)."""
    if not after:
        return "none"
    m = len(before)
    prefix = "".join(c.text for c in before)
    cont = "".join(c.text for c in after)
    first = after[0].text
    if m < len(ref) and first == ref[m].text:
        return "exact"
    if prefix and cont.startswith(prefix):
        return "echo"
    if m >= 1 and first == ref[m - 1].text:
        return "repeated"
    if m + 1 < len(ref) and first == ref[m + 1].text:
        return "skipped"
    return "retokenised"


def price(prompt: int, output: int) -> int:
    """The policy's price of a prompt and an output (no cache prices set: cached tokens are
    priced as input)."""
    return PRICE_INPUT * prompt + PRICE_OUTPUT * output


def judge(run: Mapping[str, Any]) -> dict[str, Any]:
    """The checks of one run (see the module's doc); ``run`` as :meth:`Bench.run` keeps it:
    ``stream``, ``refs`` (each engine's unbroken :class:`Stream`), ``killed``, ``spare``,
    ``records`` (the ledger's rows of the request id), ``max_tokens``."""
    stream: Stream = run["stream"]
    refs: Mapping[str, Stream] = run["refs"]
    killed: str | None = run.get("killed")
    spare: str | None = run.get("spare")
    # the chunks say their engine's token index (``timings_per_token``), else the gateway's
    # log line says after how many chunks the stream broke (``--no-timings``)
    timed = any(c.n is not None for c in stream.chunks)
    seam_chunks: int | None = run.get("seam_chunks")
    if timed or seam_chunks is None:
        before, after = split_at_seam(stream.chunks)
    else:
        before, after = list(stream.chunks[:seam_chunks]), list(stream.chunks[seam_chunks:])
    continued = bool(after)
    ref_killed = refs[killed].chunks if killed is not None and killed in refs else []
    ref_spare = refs[spare].chunks if spare is not None and spare in refs else []
    prefix = "".join(c.text for c in before)

    def same(chunks: Sequence[Chunk], ref: Sequence[Chunk]) -> bool:
        """Token for token: text and index (text only where the chunks have no index)."""
        if timed:
            return [(c.text, c.n) for c in chunks] == [(c.text, c.n) for c in ref]
        return [c.text for c in chunks] == [c.text for c in ref]

    # the chunks before the seam are the killed engine's unbroken answer's, token for token
    prefix_ok = same(before, ref_killed[:len(before)])
    kind = seam_kind(before, after, ref_killed)
    replay: Stream | None = run.get("replay")
    # the chunks after the seam are what the engine itself writes after that prefix, asked
    # directly, token for token (none lost or repeated by the gateway on the way)
    replayed = replay is not None and replay.whole and same(after, replay.chunks)
    seam_ok = prefix_ok and replayed and kind != "echo"
    text = stream.text
    unbroken = "".join(c.text for c in (ref_spare if continued else ref_killed))
    records: list[dict[str, Any]] = run.get("records") or []
    record = records[0] if len(records) == 1 else None
    usage_out = (stream.usage or {}).get("completion_tokens")
    if timed or not before:
        sent, produced = tokens_of(before), tokens_of(after)
    else:  # the killed engine's index of the last chunk sent; the continuation's own output
        sent = tokens_of(ref_killed[:len(before)]) if prefix_ok else len(before)
        produced = (usage_out - len(before) if isinstance(usage_out, int) and after
                    else len(after))
    received = sent + produced  # engine tokens that reached the client
    prompt = prompt_of(stream.chunks[0]) if stream.chunks else None
    cont_prompt = prompt_of(after[0]) if after else None
    ref = refs.get(spare or "") or refs.get(killed or "")
    unbroken_usage = (ref.usage or {}) if ref is not None else {}
    checks: dict[str, Any] = {
        "whole": stream.whole,
        "error_event": stream.error is not None,
        "error": stream.error,
        "continued": continued,
        "killed": killed,
        "late_kill": bool(killed) and not continued and stream.whole,
        "prefix_ok": prefix_ok,
        "seam": kind,
        "seam_ok": seam_ok,
        "replayed": replayed,
        "equal": text == unbroken,
        "replicas_agree": len({r.text for r in refs.values()}) == 1,
        "first_divergence": first_divergence(text, unbroken),
        "seam_at": len(prefix) if continued else None,
        "max_tokens": run.get("max_tokens"),
        "sent_tokens": sent,
        # tokens the killed engine had delivered past the chunk the client killed it at
        "kill_lag": sent - int(run["kill_after"]) if killed and before else None,
        "continuation_tokens": produced,
        "received_tokens": received,
        "prompt_tokens": prompt,
        "continuation_prompt_tokens": cont_prompt,
        # the prefix tokenised again, against the tokens the killed engine generated: 0 when
        # the continuation's context holds the same number of tokens
        "retokenised_delta": (cont_prompt - prompt - sent
                              if cont_prompt is not None and prompt is not None else None),
        "one_id": len(stream.ids) == 1,
        "one_role": stream.roles == 1,
        "one_finish": len(stream.finish_reasons) == 1,
        "marked": stream.marked,
        "usage_output": usage_out,
        "within_limit": received <= int(run.get("max_tokens") or received),
        "usage_prompt": (stream.usage or {}).get("prompt_tokens"),
        "records": len(records),
    }
    if record is not None:
        unbroken_cost = price(int(unbroken_usage.get("prompt_tokens") or 0), received)
        checks.update({
            "record_continued": bool(record["continued"]),
            "record_outcome": record["outcome"],
            "record_output": record["output"],
            "record_prompt": record["prompt_total"],
            "record_estimated": bool(record["estimated"]),
            "record_cost": record["cost_micros"],
            "continuation_prompt": record["continuation_prompt"],
            "continuation_cost": record["continuation_cost"],
            "output_is_usage": record["output"] == usage_out,
            "output_is_received": record["output"] == received,
            "prompt_is_engine": record["prompt_total"] == prompt,
            # billed once: the record's own lines, the continuation's price kept out of it
            "cost_ok": (record["cost_micros"] == price(record["prompt_total"], record["output"])
                        and record["continuation_cost"]
                        == PRICE_INPUT * record["continuation_prompt"]),
            # what an unbroken stream with the output the client received is billed
            "unbroken_cost": unbroken_cost,
            "cost_as_unbroken": record["cost_micros"] == unbroken_cost,
            "record_ok": (bool(record["continued"]) == continued
                          and record["outcome"] == ("completed" if stream.whole else "failed")
                          and (not continued or record["continuation_prompt"] > 0)),
        })
    if stream.error is not None:
        checks["cause"] = error_cause(stream, record, int(run.get("max_tokens") or 0))
    return checks


def error_cause(stream: Stream, record: Mapping[str, Any] | None, max_tokens: int) -> str:
    """Why a stream ended with the error event, as far as the client and the record tell."""
    if record is not None and max_tokens and record["output"] >= max_tokens:
        return ("not continued: the prefix counted at max_tokens or past it "
                f"(record output {record['output']} >= {max_tokens})")
    error = stream.error if isinstance(stream.error, dict) else {}
    return f"{error.get('code') or 'error'}: {error.get('message') or stream.error}"


# -- the table (pure) --------------------------------------------------------------------------


def summarise(judged: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of the table, from the judged runs."""
    n = len(judged)
    cont = [j for j in judged if j["continued"]]
    one = [j for j in judged if j["records"] == 1 and "record_output" in j]
    one_cont = [j for j in one if j["continued"]]
    records = Counter("1" if j["records"] == 1 else "0" if j["records"] == 0 else "2+"
                      for j in judged)

    def share(part: int, whole: int) -> float:
        return round(100.0 * part / whole, 1) if whole else 0.0

    def count(rows: Sequence[Mapping[str, Any]], key: str) -> int:
        return sum(bool(j.get(key)) for j in rows)

    divergence = [j["first_divergence"] - j["seam_at"] for j in cont
                  if j["first_divergence"] is not None and j["seam_at"] is not None]
    whole = count(judged, "whole")
    lags = sorted(j["kill_lag"] for j in judged if j.get("kill_lag") is not None)
    return {
        "runs": n,
        "whole": whole,
        "whole_pct": share(whole, n),
        "error_event": count(judged, "error_event"),
        "causes": dict(Counter(j["cause"] for j in judged if j.get("cause"))),
        "other_end": sum(not j["whole"] and not j["error_event"] for j in judged),
        "continued": len(cont),
        "late_kill": count(judged, "late_kill"),
        "prefix_ok": count(cont, "prefix_ok"),
        "seam_ok": count(cont, "seam_ok"),
        "replayed": count(cont, "replayed"),
        "seams": dict(Counter(j["seam"] for j in cont)),
        "equal": count(cont, "equal"),
        "equal_pct": share(count(cont, "equal"), len(cont)),
        "replicas_agree": count(judged, "replicas_agree"),
        "retokenised_same_count": sum(j["retokenised_delta"] == 0 for j in cont),
        # the runs whose chunks said both prompts (``timings_per_token``)
        "retokenised_known": sum(j["retokenised_delta"] is not None for j in cont),
        "divergence_after_seam_chars": sorted(divergence),
        "kill_lag_tokens": {"p50": lags[len(lags) // 2], "max": lags[-1],
                            "zero": lags.count(0)} if lags else None,
        "killed": dict(Counter(j["killed"] for j in judged if j.get("killed"))),
        "records": {k: records.get(k, 0) for k in ("1", "0", "2+")},
        "record_ok": count(one, "record_ok"),
        "output_is_usage": count(one, "output_is_usage"),
        "output_is_received": count(one_cont, "output_is_received"),
        "prompt_is_engine": count(one_cont, "prompt_is_engine"),
        "estimated": count(one_cont, "record_estimated"),
        "within_limit": count(cont, "within_limit"),
        "over_limit_tokens": sorted(j["received_tokens"] - int(j["max_tokens"]) for j in cont
                                    if not j["within_limit"]),
        "cost_ok": count(one, "cost_ok"),
        "cost_as_unbroken": count(one_cont, "cost_as_unbroken"),
        "with_record_continued": len(one_cont),
        "one_id_role_finish": sum(bool(j["one_id"] and j["one_role"] and j["one_finish"])
                                  for j in judged if j["whole"]),
        "marked": count(cont, "marked"),
    }


def format_table(s: Mapping[str, Any]) -> str:
    """The measured table, markdown."""
    c, rc, r1 = s["continued"], s["with_record_continued"], s["records"]["1"]
    seams = sorted(s["seams"].items(), key=lambda kv: -kv[1])
    rows = [
        ("runs (the serving engine SIGKILLed mid-stream in each)", f"{s['runs']}"),
        ("ended whole (a finish reason, `[DONE]`, no error event)",
         f"**{s['whole']} ({s['whole_pct']:.1f} %)**"),
        ("ended with the error event", f"{s['error_event']}"),
        ("ended otherwise (cut, timeout)", f"{s['other_end']}"),
        ("continued on the other engine", f"{c}"),
        ("killed after its last token (whole; not counted, run again)",
         f"{s.get('late_kills', s['late_kill'])}"),
        ("one id, one role chunk, one finish (whole streams)",
         f"{s['one_id_role_finish']} / {s['whole']}"),
        ("text before the seam = the unbroken answer's, token for token",
         f"{s['prefix_ok']} / {c}"),
        ("text after the seam = the engine's own completion of that prefix, token for token",
         f"{s['replayed']} / {c}"),
        ("seam OK (both of the above, the prefix not echoed: no token lost or repeated)",
         f"{s['seam_ok']} / {c}"),
        ("first token after the seam, against the unbroken answer",
         ", ".join(f"{k} {v}" for k, v in seams) or "-"),
        ("prefix re-tokenised to as many tokens as were generated",
         f"{s['retokenised_same_count']} / {s.get('retokenised_known', c)}"),
        ("whole text = the unbroken answer", f"{s['equal']} / {c} ({s['equal_pct']:.1f} %)"),
        ("the two replicas' unbroken answers equal", f"{s['replicas_agree']} / {s['runs']}"),
        ("usage records per request: 1 / 0 / 2+",
         " / ".join(str(s["records"][k]) for k in ("1", "0", "2+"))),
        ("record as the stream ended (`continued`, outcome, `continuation_prompt` > 0)",
         f"{s['record_ok']} / {r1}"),
        ("record `output` = the client's final usage chunk", f"{s['output_is_usage']} / {r1}"),
        ("record `output` = engine tokens the client received (continued)",
         f"{s['output_is_received']} / {rc}"),
        ("record `prompt_total` = the engine's prompt tokens (continued)",
         f"{s['prompt_is_engine']} / {rc}"),
        ("record `estimated` (continued)", f"{s['estimated']} / {rc}"),
        ("engine tokens received <= `max_tokens` (continued)",
         f"{s['within_limit']} / {c}" + (f" (over by {', '.join(map(str, s['over_limit_tokens']))})"
                                        if s["over_limit_tokens"] else "")),
        ("billed once: `cost_micros` = its prompt + output, `continuation_cost` apart",
         f"{s['cost_ok']} / {r1}"),
        ("`cost_micros` = an unbroken stream's for what the client received (continued)",
         f"{s['cost_as_unbroken']} / {rc}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'':<{width}} | measured |", f"|{'-' * (width + 2)}|---:|"]
    lines += [f"| {k:<{width}} | {v} |" for k, v in rows]
    return "\n".join(lines)


# -- the bench ---------------------------------------------------------------------------------


@dataclass
class Options:
    runs: int = 100
    max_tokens: int = 160
    seed: int = 7
    kill_seed: int = 1
    threads: int = 1
    ctx: int = 2048
    #: the public model's ``encoding``: what the gateway counts the prompt in (its estimate,
    #: where the first engine did not say its own)
    encoding: str = "o200k_base"
    #: the gateway's request asks for llama.cpp's ``timings_per_token`` (the engine's count on
    #: every chunk); off: as most clients ask, the gateway counts a chunk a token
    timings: bool = True
    workdir: Path | None = None
    model: Path | None = None
    binary: Path | None = None


def policy(urls: Mapping[str, str], key: str, workdir: Path,
           encoding: str = "o200k_base") -> dict[str, Any]:
    """The pool of both engines, continuation on; generous limits; the ledger in ``workdir``."""
    return {
        "server": {"drain_timeout": 10},
        "auth": {"keys": [{"id": "kill", "tenant": TENANT,
                           "sha256": hashlib.sha256(key.encode()).hexdigest()}]},
        "plans": [{"name": "p", "limits": {"rpm": 100_000}}],
        "tenants": [{"name": TENANT, "plan": "p"}],
        "pools": [{
            "name": POOL, "engine": "llamacpp",
            # probes every 0.5 s: a restarted engine is healthy again (un-ejected) at once
            "health": {"path": "/health", "interval": 0.5, "timeout": 2.0, "eject_after": 3,
                       "eject_base": 1.0, "eject_max": 2.0},
            "continuation": {"enabled": True},
            "backends": [{"name": name, "url": url, "max_in_flight": 4}
                         for name, url in urls.items()],
        }],
        "models": [{"name": MODEL, "pool": POOL, "backend_model": ENGINE_MODEL,
                    "encoding": encoding}],
        "prices": {"models": {MODEL: {"input": str(PRICE_INPUT), "output": str(PRICE_OUTPUT)}}},
        "store": {"data_dir": str(workdir / "data"), "spool_dir": str(workdir / "spool")},
    }


def request_body(i: int, model: str, opts: Options, timings: bool = True) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me a long story, number {i}."}],
        "max_tokens": opts.max_tokens, "temperature": 0, "seed": opts.seed,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        "timings_per_token": True,
    }
    if not timings:
        del body["timings_per_token"]
    return body


class Bench:
    """Two engines, the gateway, the ledger; :meth:`run` one kill. A context manager that
    stops everything it started, whatever happened."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.workdir = opts.workdir or Path(f"/tmp/continuation-kill-{stamp}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key = "sk-gw-kill-" + secrets.token_hex(16)
        self.admin = secrets.token_hex(16)
        self.engines: dict[str, LlamaServer] = {}
        self.gateway: subprocess.Popen[bytes] | None = None
        self.gateway_log = self.workdir / "gateway.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client()
        self.probe = httpx.Client()  # the prober thread's (finding the serving engine)
        self.request_ids: list[str] = []
        self.restarts: Counter[str] = Counter()
        self.notes: list[str] = []

    # -- lifecycle

    def __enter__(self) -> Bench:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        opts = self.opts
        binary = opts.binary or require_server_binary()
        model = opts.model or tiny_model_path(TinyModelSpec())
        slots = self.workdir / "slots"
        slots.mkdir(exist_ok=True)
        for name in NAMES:  # fixed ports: a restarted engine comes back where the pool has it
            engine = LlamaServer(model, slots=1, ctx=opts.ctx, threads=opts.threads,
                                 alias=ENGINE_MODEL, port=free_port(), binary=binary,
                                 log_path=self.workdir / f"engine-{name}.log",
                                 extra_args=["--slot-save-path", str(slots)])
            self.engines[name] = engine
            engine.start()
        config = self.workdir / "policy.yaml"
        urls = {name: e.url for name, e in self.engines.items()}
        config.write_text(yaml.safe_dump(policy(urls, self.key, self.workdir, opts.encoding)))
        env = {k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_URL"}
        env.update(PYTHONUNBUFFERED="1", GATEWAY_ADMIN_TOKEN=self.admin)
        with self.gateway_log.open("ab") as log:
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(config),
                 "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.gateway.poll() is not None:
                raise RuntimeError(f"the gateway exited ({self.gateway.returncode}) while "
                                   f"starting; log {self.gateway_log}")
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway is not up in 60 s; log {self.gateway_log}")
            time.sleep(0.05)
        self.wait_ready()

    def stop_gateway(self) -> int | None:
        """SIGTERM (it drains and flushes its ledger), SIGKILL after 30 s; its exit code."""
        proc, self.gateway = self.gateway, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        return proc.returncode

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_gateway()
        for engine in self.engines.values():
            with contextlib.suppress(Exception):
                engine.stop()
        self.client.close()
        self.probe.close()

    # -- the gateway's view

    def stats(self, client: httpx.Client | None = None) -> dict[str, Any]:
        r = (client or self.client).post(self.url + "/admin/stats", timeout=5,
                                         headers={"Authorization": f"Bearer {self.admin}"})
        r.raise_for_status()
        backends: dict[str, Any] = r.json()["pools"][POOL]["backends"]
        return backends

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> bool:
        """Until both engines answer and the gateway holds both healthy and idle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError):
                backends = self.stats()
                if all(not b["ejected"] and b["in_flight"] == 0 for b in backends.values()):
                    return True
            time.sleep(0.05)
        self.notes.append(f"not ready in {timeout:.0f} s: {self.stats_or_error()}")
        return False

    def stats_or_error(self) -> str:
        try:
            return json.dumps(self.stats())
        except Exception as exc:
            return repr(exc)

    def serving(self, timeout: float = 10.0, log: list[Any] | None = None) -> str | None:
        """The engine the stream is on, asked from the prober's thread (its own client) as the
        request goes out: the gateway's in-flight count, polled every 5 ms until one backend
        holds it (the pick comes before the engine's first byte, so this usually knows before
        the client has its headers); else the engines' busy slots."""
        start = time.monotonic()
        deadline = start + timeout
        while time.monotonic() < deadline:
            try:
                busy = [name for name, b in self.stats(self.probe).items()
                        if b["in_flight"] > 0]
            except (httpx.HTTPError, KeyError) as exc:
                busy = [repr(exc)]
            if log is not None and len(log) < 50:
                log.append((round(time.monotonic() - start, 4), busy))
            if len(busy) == 1 and busy[0] in self.engines:
                return busy[0]
            time.sleep(0.005)
        for name, engine in self.engines.items():
            with contextlib.suppress(OSError, ValueError):
                status, slots = engine.get("/slots", timeout=2.0)
                if status == 200 and any(s.get("is_processing") for s in slots):
                    return name
        return None

    # -- one run

    def erase(self, names: Sequence[str] = NAMES, note: str = "") -> None:
        """Empty the engines' slots (their prompt caches): the next answer starts cold."""
        for name in names:
            r = self.client.post(self.engines[name].url + "/slots/0?action=erase", timeout=10,
                                 headers=CLOSE)
            if r.status_code != 200:
                self.notes.append(f"{note}erasing {name}'s slot: {r.status_code} {r.text}")

    def reference(self, i: int) -> dict[str, Stream]:
        """Each engine's unbroken answer to run ``i``'s request, cold (slots erased before and
        after). ``Connection: close`` to the engines: llama-server closes a kept-alive
        connection after a few requests, and a client reusing it then gets no answer."""
        refs: dict[str, Stream] = {}
        self.erase(note=f"run {i}: ")
        for name, engine in self.engines.items():
            got = read_stream(self.client, engine.url, request_body(i, ENGINE_MODEL, self.opts),
                              CLOSE)
            if not got.whole:
                raise RuntimeError(f"engine {name}: its unbroken answer did not end whole: "
                                   f"{got.status} {got.error or got.transport or got.body}")
            refs[name] = got
        self.erase(note=f"run {i}: ")
        return refs

    def replay(self, i: int, name: str, prefix: str, tokens: int) -> Stream:
        """The continuation asked of engine ``name`` directly, cold, as the gateway asks it
        (``continuation_body``: the prefix as a final assistant message, continued), for
        ``tokens`` tokens: what the engine itself writes after that prefix."""
        body = request_body(i, ENGINE_MODEL, self.opts)
        body["messages"] = [*body["messages"], {"role": "assistant", "content": prefix}]
        body.update(continue_final_message=True, add_generation_prompt=False,
                    max_tokens=max(1, tokens))
        self.erase([name], note=f"run {i}: ")
        got = read_stream(self.client, self.engines[name].url, body, CLOSE)
        self.erase([name], note=f"run {i}: ")
        return got

    def kill(self, name: str) -> None:
        engine = self.engines[name]
        proc = engine.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)  # dead before the next chunk is read

    def restart(self, name: str) -> None:
        """The killed engine started again on its port (a few tries: the port may linger)."""
        engine = self.engines[name]
        engine.stop()  # reaps it
        for attempt in range(5):
            try:
                engine.start()
                self.restarts[name] += 1
                return
            except RuntimeError:
                if attempt == 4:
                    raise
                time.sleep(0.5)

    def records(self, request_id: str, timeout: float = RECORD_TIMEOUT) -> list[dict[str, Any]]:
        """The request's rows in the SQLite ledger, once a final (not ``interrupted``) one is
        there or after ``timeout``."""
        path = self.workdir / "data" / "ledger.db"
        deadline = time.monotonic() + timeout
        rows: list[dict[str, Any]] = []
        while True:
            with contextlib.suppress(sqlite3.Error):
                rows = ledger_rows(path, request_id)
                if rows and all(r["outcome"] != "interrupted" for r in rows):
                    return rows
            if time.monotonic() > deadline:
                return rows
            time.sleep(0.1)

    def seam_chunks(self, request_id: str) -> int | None:
        """After how many chunks the gateway says the request's stream broke and was
        continued (its log line; None: it says none was)."""
        for line in log_lines(self.gateway_log, request_id):
            found = _CONTINUED_AFTER.search(line)
            if found is not None:
                return int(found.group(1))
        return None

    def run(self, i: int, kill_after: int) -> dict[str, Any]:
        """Run ``i``: the references, then the stream through the gateway with the engine
        serving it SIGKILLed after ``kill_after`` content chunks; then the engine restarted."""
        refs = self.reference(i)
        self.wait_ready()
        state: dict[str, Any] = {"killed": None, "serving": None, "kill_s": None}
        started = time.monotonic()
        # which engine serves it, asked on a thread as the request goes out: reading goes on
        probes: list[Any] = []
        prober = threading.Thread(target=lambda: state.update(serving=self.serving(log=probes)),
                                  name="serving-engine", daemon=True)
        prober.start()

        def on_content(stream: Stream) -> None:
            if len(stream.chunks) < kill_after or state["killed"] is not None:
                return
            prober.join(10)  # known long before, but for the first chunks of a slow box
            if state["serving"] is None:
                return
            state["text_at_kill"] = stream.text
            state["killed_at_chunk"] = len(stream.chunks)
            self.kill(state["serving"])
            state["killed"] = state["serving"]
            state["kill_s"] = round(time.monotonic() - started, 4)

        stream = read_stream(self.client, self.url,
                             request_body(i, MODEL, self.opts, self.opts.timings),
                             {"Authorization": f"Bearer {self.key}"}, on_content)
        prober.join(15)
        elapsed = time.monotonic() - started
        if state["killed"]:
            self.restart(state["killed"])
        spare = next((n for n in NAMES if n != state["killed"]), None)
        rid = stream.request_id
        if rid:
            self.request_ids.append(rid)
        records = self.records(rid) if rid else []
        seam_chunks = self.seam_chunks(rid) if rid and not self.opts.timings else None
        if seam_chunks is not None:
            before, after = stream.chunks[:seam_chunks], stream.chunks[seam_chunks:]
        else:
            before, after = split_at_seam(stream.chunks)
        replay = None
        if after and spare is not None:
            produced = tokens_of(after)
            usage_out = (stream.usage or {}).get("completion_tokens")
            if seam_chunks is not None and isinstance(usage_out, int):
                produced = usage_out - seam_chunks  # the continuation's own output (its usage)
            replay = self.replay(i, spare, "".join(c.text for c in before), produced)
        run = {"run": i, "kill_after": kill_after, "max_tokens": self.opts.max_tokens,
               "killed": state["killed"], "spare": spare,
               "serving": state["serving"], "kill_s": state["kill_s"],
               "text_at_kill": state.get("text_at_kill"),
               "killed_at_chunk": state.get("killed_at_chunk"), "seconds": round(elapsed, 3),
               "probes": probes,
               "refs": refs, "stream": stream, "records": records, "replay": replay,
               "seam_chunks": seam_chunks}
        run["judged"] = judge(run)
        if state.get("text_at_kill") is not None:
            run["judged"]["kill_text_ok"] = stream.text.startswith(state["text_at_kill"])
        return run


def ledger_rows(path: Path, request_id: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``usage_records`` (of one request id, or all) from the SQLite ledger."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                            timeout=10)) as db:
        db.row_factory = sqlite3.Row
        if request_id is None:
            rows = db.execute("SELECT * FROM usage_records")
        else:
            rows = db.execute("SELECT * FROM usage_records WHERE request_id = ?",
                              (request_id,))
        return [dict(r) for r in rows]


def mid_stream(run: Mapping[str, Any]) -> bool:
    """Whether the run's kill fell inside the stream: an engine was killed, and not after
    it had sent its whole answer (a *late* kill: whole, nothing to continue)."""
    return bool(run["killed"]) and not run["judged"]["late_kill"]


def gateway_metrics(text: str) -> dict[str, float]:
    """The continuation counters of the gateway's ``/metrics``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("gateway_stream_continuation", "gateway_ejections_total")):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def log_lines(path: Path, *needles: str) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if any(n in line for n in needles)]


def encode_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run as JSON: the stream's chunks as [text, index, prompt_n, cache_n]."""
    out = {k: v for k, v in run.items() if k not in ("stream", "replay")}
    replay: Stream | None = run.get("replay")
    out["replay"] = None if replay is None else {
        "text": replay.text, "whole": replay.whole,
        "chunks": [[c.text, c.n] for c in replay.chunks]}
    stream: Stream = run["stream"]
    out["stream"] = {
        "status": stream.status, "request_id": stream.request_id, "text": stream.text,
        "chunks": [[c.text, c.n, c.prompt_n, c.cache_n] for c in stream.chunks],
        "finish_reasons": stream.finish_reasons, "usage": stream.usage, "error": stream.error,
        "done": stream.done, "roles": stream.roles, "ids": sorted(stream.ids),
        "models": sorted(stream.models), "marked": stream.marked,
        "transport": stream.transport, "body": stream.body,
    }
    out["refs"] = {name: {"text": ref.text, "usage": ref.usage,
                          "chunks": [[c.text, c.n] for c in ref.chunks]}
                   for name, ref in run["refs"].items()}
    return out


def measure(opts: Options, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """``opts.runs`` runs whose kill fell mid-stream (a late kill, after the engine had sent
    its whole answer, or a run whose engine was not found, is run again with the next kill
    point, and kept apart), the final ledger count and the summary."""
    rng = random.Random(opts.kill_seed)  # kill points uniform over 1..max_tokens chunks
    runs: list[dict[str, Any]] = []
    apart: list[dict[str, Any]] = []
    metrics: dict[str, float] = {}
    with Bench(opts) as b:
        i = 0
        while len(runs) < opts.runs and i < 3 * opts.runs:
            k = rng.randint(1, opts.max_tokens)
            run = b.run(i, k)
            i += 1
            (runs if mid_stream(run) else apart).append(run)
            j = run["judged"]
            progress(f"run {i:3d} ({len(runs)}/{opts.runs}): kill after {k:3d} chunks on "
                     f"{run['killed']} (it had sent {j['sent_tokens']}); whole={j['whole']} "
                     f"continued={j['continued']} "
                     f"seam={j['seam']} equal={j['equal']} records={j['records']} "
                     f"({run['seconds']:.2f} s){'' if mid_stream(run) else ' (run again)'}")
        with contextlib.suppress(httpx.HTTPError):
            metrics = gateway_metrics(b.client.get(b.url + "/metrics", timeout=10).text)
        exit_code = b.stop_gateway()
        # the authoritative count: after the gateway drained and flushed its ledger
        rows = ledger_rows(b.workdir / "data" / "ledger.db")
        per_id = Counter(r["request_id"] for r in rows)
        for run in runs + apart:
            rid = run["stream"].request_id
            run["judged"]["records"] = per_id.get(rid, 0) if rid else 0
        broken = log_lines(b.gateway_log, "stream broken")
        tracebacks = sum(1 for line in log_lines(b.gateway_log, "Traceback"))
        workdir, notes, restarts = b.workdir, b.notes, dict(b.restarts)
    summary = summarise([r["judged"] for r in runs])
    summary["late_kills"] = sum(1 for r in apart if r["killed"])
    summary["not_found"] = sum(1 for r in apart if not r["killed"])
    summary["apart_records"] = dict(Counter(r["judged"]["records"] for r in apart))
    return {
        "summary": summary,
        "options": {k: str(v) if isinstance(v, Path) else v
                    for k, v in dataclasses.asdict(opts).items()},
        "workdir": str(workdir), "notes": notes, "restarts": restarts,
        "gateway_exit": exit_code, "gateway_tracebacks": tracebacks,
        "gateway_broken_lines": broken[-200:], "metrics": metrics,
        "runs": [encode_run(r) for r in runs],
        "runs_apart": [encode_run(r) for r in apart],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.continuation_kill",
        description="SIGKILL the llama-server serving a stream at random points; check that "
        "the stream goes on whole on the other replica, with one usage record.")
    p.add_argument("--runs", type=int, default=100,
                   help="streams killed mid-stream (100); a kill that fell after the engine "
                   "had sent its whole answer is run again with the next kill point")
    p.add_argument("--max-tokens", type=int, default=160,
                   help="max_tokens of each answer, ignore_eos on (160)")
    p.add_argument("--seed", type=int, default=7, help="the requests' sampling seed (7)")
    p.add_argument("--kill-seed", type=int, default=1, help="seed of the kill points (1)")
    p.add_argument("--threads", type=int, default=1, help="threads of each engine (1)")
    p.add_argument("--encoding", choices=("o200k_base", "cl100k_base"), default="o200k_base",
                   help="the model's encoding in the policy: what the gateway counts the "
                   "prompt in where the first engine did not say it (o200k_base, the default)")
    p.add_argument("--no-timings", action="store_true",
                   help="the gateway's request without llama.cpp's timings_per_token (as most "
                   "clients send theirs): the gateway counts the tokens sent a chunk a token")
    p.add_argument("--target", type=float, default=99.0,
                   help="share of runs that must end whole, %% (99)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="policy, logs, ledger (default: a new directory under /tmp, kept)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results ({DEFAULT_OUT})")
    args = p.parse_args(argv)
    opts = Options(runs=args.runs, max_tokens=args.max_tokens, seed=args.seed,
                   kill_seed=args.kill_seed, threads=args.threads, encoding=args.encoding,
                   workdir=args.workdir, timings=not args.no_timings)
    started = time.monotonic()
    try:
        result = measure(opts)
    except Exception as exc:
        print(f"the bench could not run: {exc!r}", file=sys.stderr)
        return 2
    result["seconds"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    s = result["summary"]
    print()
    print(format_table(s))
    print()
    print(f"{result['seconds']:.0f} s; runs in {args.out}; logs in {result['workdir']}")
    for note in result["notes"]:
        print("note:", note)
    ok = s["whole_pct"] >= args.target and s["records"]["1"] == s["runs"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
