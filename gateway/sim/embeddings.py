"""Embeddings: deterministic unit vectors seeded by each input, with OpenAI's response shape.

Embedding requests bypass the step loop (an embedding model is a different replica in practice);
they cost only the prompt count and the vector maths.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from typing import Any

import msgspec

from gateway.sim.errors import BadRequest
from gateway.tokenizers import count_text

__all__ = ["embedding_answer", "embedding_body", "embedding_vector"]

_encode = msgspec.json.Encoder().encode
_MAX_DIM = 8192


def embedding_vector(key: bytes, dim: int) -> list[float]:
    """A unit vector that depends only on ``key`` and ``dim``."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    gauss = random.Random(seed).gauss
    vec = [gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]


def _inputs(raw: Any, encoding: str) -> list[tuple[bytes, int]]:
    """(seed key, token count) for each input: a string, strings, a token array or arrays."""
    if isinstance(raw, str):
        return [(raw.encode(), count_text(raw, encoding))]
    if isinstance(raw, list) and raw:
        if all(isinstance(x, str) for x in raw):
            return [(s.encode(), count_text(s, encoding)) for s in raw]
        if all(isinstance(x, int) for x in raw):
            return [(_encode(raw), len(raw))]
        if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in raw):
            return [(_encode(x), len(x)) for x in raw]
    raise BadRequest(
        "input must be a string, a list of strings, a token array or a list of token arrays",
        param="input",
    )


def embedding_body(body: dict[str, Any], *, model: str, default_dim: int, encoding: str) -> bytes:
    """The JSON answer to ``POST /v1/embeddings``; raises :class:`BadRequest` on bad input."""
    return embedding_answer(body, model=model, default_dim=default_dim, encoding=encoding)[0]


def embedding_answer(
    body: dict[str, Any], *, model: str, default_dim: int, encoding: str
) -> tuple[bytes, int]:
    """:func:`embedding_body` and the prompt tokens it reports."""
    dim = body.get("dimensions")
    if dim is None:
        dim = default_dim
    elif not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= _MAX_DIM:
        raise BadRequest(f"dimensions must be an integer in 1..{_MAX_DIM}", param="dimensions")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest("encoding_format must be 'float' or 'base64'", param="encoding_format")
    data: list[dict[str, Any]] = []
    total = 0
    for i, (key, tokens) in enumerate(_inputs(body.get("input"), encoding)):
        total += tokens
        vec = embedding_vector(key, dim)
        emb: list[float] | str = vec
        if fmt == "base64":
            emb = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    answer = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }
    return _encode(answer), total
