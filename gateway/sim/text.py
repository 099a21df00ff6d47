"""Deterministic generated text whose token count is known exactly.

Every word is a space-prefixed lowercase English word that is one token in both o200k_base and
cl100k_base. Both encodings pre-split text before each space-prefixed letter run, so concatenated
words never merge: ``n`` words are exactly ``n`` tokens, whichever encoding the gateway counts with.
The words are checked against both encodings on first use (a few ms, cached).
"""

from __future__ import annotations

import functools
import hashlib
import random
from typing import TYPE_CHECKING

from gateway.tokenizers import get_encoding

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ENCODINGS", "generate", "generate_words", "request_seed", "vocabulary"]

#: Encodings in which every vocabulary word must be exactly one token.
ENCODINGS = ("o200k_base", "cl100k_base")

_WORDS = """
the of and to in is that it for was on are as with be at by this have from or one had not but
what all were when we there can an your which their said if do will each about how up out them
then she many some so these would other into has more her two like him see time could no make
than first been its who now people my made over did down only way find use may water long little
very after words called just where most know get through back much before go good new write our
used me man too any day same right look think also around another came come work three word must
because does part even place well such here take why things help put years different away again
off went old number great tell men say small every found still between name should home big give
air line set own under read last never us left end along while might next sound below saw
something thought both few those always looked show large often together asked house world going
want school important until form food keep children feet land side without boy once animals life
enough took sometimes four head above kind began almost live page got earth need far hand high
year mother light parts country father let night following picture being study second eyes soon
times story boys since white days ever paper hard near sentence better best across during today
others however sure means knew try told young miles sun ways thing whole hear example heard
several change answer room sea against top turned learn point city play toward five using himself
usually model data system value output state result process language text token network memory
engine request server batch simple quick bright open clear real true fast slow early late blue
green red black cold warm deep wide short
"""


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """The space-prefixed words that are one token in every encoding of :data:`ENCODINGS`."""
    encodings = [get_encoding(name) for name in ENCODINGS]
    words = dict.fromkeys(" " + w for w in _WORDS.split())
    vocab = tuple(w for w in words if all(len(e.encode_ordinary(w)) == 1 for e in encodings))
    if len(vocab) < 100:  # pragma: no cover - would mean a broken BPE file
        raise RuntimeError(f"only {len(vocab)} single-token words; check the BPE files")
    return vocab


def request_seed(key: bytes, seed: int | None) -> int:
    """A stable 64-bit seed from the request's prompt bytes and its ``seed`` field."""
    h = hashlib.blake2b(key, digest_size=8)
    if seed is not None:
        h.update(b"\x00seed=%d" % seed)
    return int.from_bytes(h.digest(), "little")


def generate_words(seed: int, n: int, stop: Sequence[str] = ()) -> tuple[list[str], str]:
    """``n`` words (tokens) and finish reason ``"length"``; fewer and ``"stop"`` if a stop hits.

    A stop string ends the output before the first word in which a match begins, so the text
    never contains it and the token count stays exact (OpenAI cuts mid-token; we cut at a word).
    """
    words, matched = generate(seed, n, stop)
    return words, "length" if matched is None else "stop"


def generate(seed: int, n: int, stop: Sequence[str] = ()) -> tuple[list[str], str | None]:
    """:func:`generate_words`, naming the stop string that ended the output (``None``: none did).

    When several match, the one whose match begins first wins (the first listed on a tie).
    """
    words = random.Random(seed).choices(vocabulary(), k=n) if n > 0 else []
    stops = [s for s in stop if s]
    if not stops or not words:
        return words, None
    text = "".join(words)
    hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    if not hits:
        return words, None
    cut, matched = min(hits, key=lambda hit: hit[0])
    end = 0
    for i, word in enumerate(words):
        end += len(word)
        if end > cut:
            return words[:i], matched
    return words, matched  # pragma: no cover - cut < len(text) always ends inside a word
