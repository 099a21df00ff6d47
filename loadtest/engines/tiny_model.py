"""A tiny llama GGUF for ``llama-server``: random weights, the real GPT-2 tokenizer.

The model computes real attention and a real feed-forward pass over a real 50,257-token
vocabulary, so an engine serving it does the work (tokenize, prefill, decode, sample, detokenize,
KV cache, slots) of a real model at a small size; its text is noise. The tokenizer is copied
from llama.cpp's ``models/ggml-vocab-gpt-2.gguf`` (kept in the engine cache by the build), so
prompt token counts are GPT-2's (tiktoken's ``gpt2`` encoding counts the same ids): no BOS is
added, and the chat template is ChatML written as plain text.

Layout (``src/models/llama.cpp`` of llama.cpp, shapes in numpy order, the reverse of ggml's):
``token_embd``/``output`` (vocab, embd) F16; per block ``attn_norm``/``ffn_norm`` (embd,) F32,
``attn_q`` (heads*hd, embd), ``attn_k``/``attn_v`` (kv_heads*hd, embd), ``attn_output`` (embd,
heads*hd), ``ffn_gate``/``ffn_up`` (ff, embd), ``ffn_down`` (embd, ff), F16 unless
``dtype="f32"``; ``output_norm`` (embd,) F32.

The file is deterministic for a :class:`TinyModelSpec` (same bytes for the same spec and gguf
version) and written once into ``<engine cache>/models/`` under a name that spells the spec:

    python -m loadtest.engines.tiny_model --embedding 128 --layers 2   # prints the path
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from loadtest.engines.build import VERSION, EngineNotBuilt, cache_dir

__all__ = ["CHATML_TEMPLATE", "VOCAB_FILE", "TinyModelSpec", "main", "tiny_model_path",
           "vocab_path", "write_tiny_model"]

VOCAB_FILE = "ggml-vocab-gpt-2.gguf"

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)
"""llama.cpp's own ChatML fallback, stored in the file so the server's choice is explicit."""


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
    """The shape of a tiny model. ``kv_heads`` defaults to ``heads`` (no GQA), ``ff`` to
    ``4 * embedding``."""

    embedding: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int | None = None
    ff: int | None = None
    context: int = 4096
    seed: int = 0
    dtype: str = "f16"

    def __post_init__(self) -> None:
        if not 16 <= self.embedding <= 4096:
            raise ValueError(f"embedding {self.embedding}: 16..4096 (64..256 is the usual range)")
        if not 1 <= self.layers <= 64:
            raise ValueError(f"layers {self.layers}: 1..64")
        if self.heads < 1 or self.embedding % self.heads:
            raise ValueError(f"embedding {self.embedding} is not a multiple of heads {self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} is odd (RoPE rotates pairs)")
        if self.n_kv_heads < 1 or self.heads % self.n_kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.n_kv_heads}")
        if self.n_ff < 1 or self.context < 16:
            raise ValueError("ff >= 1 and context >= 16")
        if self.dtype not in ("f16", "f32"):
            raise ValueError(f"dtype {self.dtype!r}: f16 or f32")

    @property
    def head_dim(self) -> int:
        return self.embedding // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def n_ff(self) -> int:
        return 4 * self.embedding if self.ff is None else self.ff

    @property
    def filename(self) -> str:
        return (f"tiny-llama-e{self.embedding}-l{self.layers}-h{self.heads}-kv{self.n_kv_heads}"
                f"-ff{self.n_ff}-c{self.context}-s{self.seed}-{self.dtype}.gguf")


def _gguf() -> ModuleType:
    """The ``gguf`` package: installed (the ``test`` extra), else the engine cache's gguf-py."""
    try:
        import gguf
    except ImportError:
        vendored = cache_dir() / "gguf-py"
        if not (vendored / "gguf").is_dir():
            raise EngineNotBuilt(f"the gguf package is not installed and {vendored} is missing: "
                                 "pip install gguf, or run `make llama-server`") from None
        sys.path.insert(0, str(vendored))
        import gguf
    return gguf


def vocab_path() -> Path:
    """``ggml-vocab-gpt-2.gguf`` from the engine cache (taken out of the cached llama-cpp-python
    sdist when the build has not put it there yet)."""
    path = cache_dir() / "models" / VOCAB_FILE
    if path.is_file():
        return path
    sdist = cache_dir() / f"llama_cpp_python-{VERSION}.tar.gz"
    if sdist.is_file():
        member = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/{VOCAB_FILE}"
        with tarfile.open(sdist) as tar:
            src = tar.extractfile(member)
            if src is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{VOCAB_FILE}.{os.getpid()}")
                tmp.write_bytes(src.read())
                os.replace(tmp, path)
                return path
    raise EngineNotBuilt(f"{path} is missing: run `make llama-server`")


def _tokenizer(gguf: ModuleType, vocab: Path) -> dict[str, Any]:
    """Every ``tokenizer.ggml.*`` key of the vocab file, as Python values (read once: ~2 s)."""
    stat = vocab.stat()
    return _read_tokenizer(gguf, vocab.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_tokenizer(gguf: ModuleType, vocab: Path, size: int, mtime_ns: int) -> dict[str, Any]:
    reader = gguf.GGUFReader(vocab)
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.ggml."):
            out[name] = field.contents()
    for key in ("tokens", "merges", "token_type", "model", "pre", "bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" not in out:
            raise ValueError(f"{vocab} has no tokenizer.ggml.{key}")
    return out


def write_tiny_model(path: Path, spec: TinyModelSpec, vocab: Path | None = None) -> Path:
    """Write the model for ``spec`` to ``path`` (replacing it atomically); returns ``path``."""
    import numpy as np

    gguf = _gguf()
    tok = _tokenizer(gguf, vocab or vocab_path())
    n_vocab = len(tok["tokenizer.ggml.tokens"])
    e, hd, ff = spec.embedding, spec.head_dim, spec.n_ff
    q_dim, kv_dim = spec.heads * hd, spec.n_kv_heads * hd
    rng = np.random.default_rng(spec.seed)
    wtype = np.float16 if spec.dtype == "f16" else np.float32

    def weight(rows: int, cols: int) -> Any:
        # std 1/sqrt(fan_in) keeps activations O(1) through the blocks; the logits then spread
        # enough for sampling to pick varied tokens rather than a flat or a one-hot choice
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(wtype)

    def norm() -> Any:
        return np.ones(e, dtype=np.float32)

    arch = "llama"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        writer.add_name(path.stem)
        writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16"
                                 else gguf.LlamaFileType.ALL_F32))
        writer.add_vocab_size(n_vocab)
        writer.add_context_length(spec.context)
        writer.add_embedding_length(e)
        writer.add_block_count(spec.layers)
        writer.add_feed_forward_length(ff)
        writer.add_head_count(spec.heads)
        writer.add_head_count_kv(spec.n_kv_heads)
        writer.add_rope_dimension_count(hd)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)

        writer.add_tokenizer_model(tok["tokenizer.ggml.model"])
        writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
        writer.add_token_list(tok["tokenizer.ggml.tokens"])
        writer.add_token_types(tok["tokenizer.ggml.token_type"])
        writer.add_token_merges(tok["tokenizer.ggml.merges"])
        writer.add_bos_token_id(int(tok["tokenizer.ggml.bos_token_id"]))
        writer.add_eos_token_id(int(tok["tokenizer.ggml.eos_token_id"]))
        writer.add_add_bos_token(False)
        writer.add_chat_template(CHATML_TEMPLATE)

        writer.add_tensor("token_embd.weight", weight(n_vocab, e))
        for i in range(spec.layers):
            blk = f"blk.{i}"
            writer.add_tensor(f"{blk}.attn_norm.weight", norm())
            writer.add_tensor(f"{blk}.attn_q.weight", weight(q_dim, e))
            writer.add_tensor(f"{blk}.attn_k.weight", weight(kv_dim, e))
            writer.add_tensor(f"{blk}.attn_v.weight", weight(kv_dim, e))
            writer.add_tensor(f"{blk}.attn_output.weight", weight(e, q_dim))
            writer.add_tensor(f"{blk}.ffn_norm.weight", norm())
            writer.add_tensor(f"{blk}.ffn_gate.weight", weight(ff, e))
            writer.add_tensor(f"{blk}.ffn_up.weight", weight(ff, e))
            writer.add_tensor(f"{blk}.ffn_down.weight", weight(e, ff))
        writer.add_tensor("output_norm.weight", norm())
        writer.add_tensor("output.weight", weight(n_vocab, e))

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return path


def tiny_model_path(spec: TinyModelSpec | None = None, *, directory: Path | None = None) -> Path:
    """The cached model file for ``spec`` (default :class:`TinyModelSpec`), written if absent.

    ``directory`` defaults to ``<engine cache>/models``. Concurrent callers may both write; each
    renames a complete file into place, and the contents are the same.
    """
    spec = spec or TinyModelSpec()
    path = (directory or cache_dir() / "models") / spec.filename
    if path.is_file():
        return path
    return write_tiny_model(path, spec)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadtest.engines.tiny_model``: write (once) and print the model's path."""
    d = TinyModelSpec()
    p = argparse.ArgumentParser(prog="python -m loadtest.engines.tiny_model",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--embedding", type=int, default=d.embedding, help="embedding length")
    p.add_argument("--layers", type=int, default=d.layers, help="blocks")
    p.add_argument("--heads", type=int, default=d.heads, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=None, help="KV heads (default: heads)")
    p.add_argument("--ff", type=int, default=None, help="feed-forward length (default 4x embd)")
    p.add_argument("--context", type=int, default=d.context, help="trained context length")
    p.add_argument("--seed", type=int, default=d.seed, help="weights seed")
    p.add_argument("--dtype", choices=("f16", "f32"), default=d.dtype, help="matrix type")
    p.add_argument("--out", type=Path, default=None, help="directory (default: the cache)")
    a = p.parse_args(argv)
    spec = TinyModelSpec(embedding=a.embedding, layers=a.layers, heads=a.heads,
                         kv_heads=a.kv_heads, ff=a.ff, context=a.context, seed=a.seed,
                         dtype=a.dtype)
    print(tiny_model_path(spec, directory=a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
