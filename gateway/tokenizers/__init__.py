"""Offline tiktoken encodings and OpenAI-style prompt counting.

A leaf package: the simulator and the accounting stage both count tokens with it, and it imports
nothing else of the gateway. The BPE files ship as package data (see ``bpe/README.md``) so that
nothing is downloaded at start-up; :func:`get_encoding` points tiktoken at them and checks their
sha256 before use.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tiktoken

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "BPE_DIR",
    "BPE_FILES",
    "count_chat_prompt",
    "count_text",
    "get_encoding",
    "verify_bpe_files",
]

BPE_DIR = Path(__file__).with_name("bpe")

#: encoding name -> (file name = sha1 of tiktoken's download URL, expected sha256)
BPE_FILES: dict[str, tuple[str, str]] = {
    "cl100k_base": (
        "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        "fb374d419588a4632f3f557e76b4b70aebbca790",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

_lock = threading.Lock()
_cache: dict[str, tiktoken.Encoding] = {}

# OpenAI's documented chat overhead: every message costs 3 tokens of framing, a name 1 more, and the
# reply is primed with 3 (<|start|>assistant<|message|>).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3


def verify_bpe_files() -> dict[str, str]:
    """Return encoding -> actual sha256 of the shipped file (tests compare with BPE_FILES)."""
    return {
        name: hashlib.sha256((BPE_DIR / fname).read_bytes()).hexdigest()
        for name, (fname, _) in BPE_FILES.items()
    }


def get_encoding(name: str = "o200k_base") -> tiktoken.Encoding:
    """Load an encoding from the shipped files, never from the network.

    tiktoken reads ``TIKTOKEN_CACHE_DIR`` when it loads; we point it at our package data for the
    duration of the load only, so a user's own setting is left as it was.
    """
    enc = _cache.get(name)
    if enc is not None:
        return enc
    if name not in BPE_FILES:
        raise ValueError(f"unknown encoding {name!r}; shipped: {', '.join(sorted(BPE_FILES))}")
    with _lock:
        enc = _cache.get(name)
        if enc is None:
            saved = os.environ.get("TIKTOKEN_CACHE_DIR")
            os.environ["TIKTOKEN_CACHE_DIR"] = str(BPE_DIR)
            try:
                enc = tiktoken.get_encoding(name)
            finally:
                if saved is None:
                    os.environ.pop("TIKTOKEN_CACHE_DIR", None)
                else:
                    os.environ["TIKTOKEN_CACHE_DIR"] = saved
            # the encoder's Rust core holds its own copy of the ranks; the Python dict beside
            # it (200,000 bytes keys for o200k_base) is read only to pickle the Encoding,
            # which nothing here does, and is 27-31 MB of every worker's memory
            enc._mergeable_ranks = {}
            _cache[name] = enc
    return enc


def count_text(text: str, encoding: str = "o200k_base") -> int:
    """Tokens in plain text; special-token strings count as ordinary text, as the APIs do."""
    return len(get_encoding(encoding).encode_ordinary(text))


def _content_text(content: Any) -> str:
    """Text of a message's content: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def count_chat_prompt(messages: Iterable[Mapping[str, Any]], encoding: str = "o200k_base") -> int:
    """Prompt tokens of a chat request, counted the way OpenAI documents it."""
    enc = get_encoding(encoding)
    total = REPLY_PRIMING
    for message in messages:
        total += TOKENS_PER_MESSAGE
        total += len(enc.encode_ordinary(str(message.get("role", ""))))
        total += len(enc.encode_ordinary(_content_text(message.get("content"))))
        name = message.get("name")
        if name:
            total += TOKENS_PER_NAME + len(enc.encode_ordinary(str(name)))
    return total
