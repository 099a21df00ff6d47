"""The shipped BPE files are the right ones and load with no network."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.tokenizers import BPE_FILES, count_chat_prompt, count_text, verify_bpe_files


def test_bpe_hashes_match_tiktoken() -> None:
    """Each file's sha256 is the one tiktoken itself checks for that encoding."""
    import tiktoken_ext.openai_public as public  # tiktoken's own table of expected hashes

    with open(public.__file__, encoding="utf-8") as fh:
        source = fh.read()
    actual = verify_bpe_files()
    for name, (_, expected) in BPE_FILES.items():
        assert actual[name] == expected
        assert expected in source


@pytest.mark.process
def test_loads_with_network_unreachable() -> None:
    """A fresh process with every proxy pointing at a closed port and no cache still counts."""
    env = {
        **os.environ,
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "TIKTOKEN_CACHE_DIR": "/nonexistent-cache",
    }
    code = (
        "from gateway.tokenizers import count_text;"
        "print(count_text('hello world', 'o200k_base'), count_text('hello world', 'cl100k_base'))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "2"]
    # the user's own setting is restored after loading
    code2 = (
        "import os; from gateway.tokenizers import get_encoding; get_encoding();"
        "print(os.environ['TIKTOKEN_CACHE_DIR'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.stdout.strip() == "/nonexistent-cache"


def test_chat_prompt_counting() -> None:
    """OpenAI's framing: 3 per message, 1 per name, 3 to prime the reply."""
    one = count_chat_prompt([{"role": "user", "content": "hi"}])
    assert one == 3 + count_text("user") + count_text("hi") + 3
    named = count_chat_prompt([{"role": "user", "content": "hi", "name": "bob"}])
    assert named == one + 1 + count_text("bob")
    parts = count_chat_prompt([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert parts == one


_MEMORY_PROBE = """
import gc, os
def rss_kb():
    with open(f"/proc/{os.getpid()}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
import tiktoken  # noqa: F401  (its import is not the encoding's cost)
from gateway.tokenizers import get_encoding
before = rss_kb()
enc = get_encoding("o200k_base")
gc.collect()
print(rss_kb() - before, len(enc.encode_ordinary("hello world")), enc.n_vocab,
      enc.decode(enc.encode_ordinary("héllo wörld")))
"""


@pytest.mark.process
def test_an_encoding_keeps_one_copy_of_its_ranks_in_memory() -> None:
    """tiktoken keeps the 200,000 ranks twice, in its Rust core and in a Python dict read only
    to pickle the encoding; the gateway drops the dict: a worker loading o200k_base grows by
    ~47 MB instead of ~74, and the encoding still counts, knows its vocabulary and decodes."""
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split(maxsplit=3)
    grown_kb, hello, vocab, decoded = int(out[0]), int(out[1]), int(out[2]), out[3].strip()
    assert (hello, vocab, decoded) == (2, 200019, "héllo wörld")
    assert grown_kb < 60 * 1024, f"o200k_base took {grown_kb / 1024:.0f} MB"
