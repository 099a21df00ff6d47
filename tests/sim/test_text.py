"""Generated text: one token per word in both encodings, reproducible, stop strings."""

from __future__ import annotations

import pytest

from gateway.sim.text import ENCODINGS, generate_words, request_seed, vocabulary
from gateway.tokenizers import count_text


def test_every_word_is_one_token_in_both_encodings() -> None:
    """The vocabulary is filtered to words that are a single token in o200k and cl100k."""
    vocab = vocabulary()
    assert len(vocab) > 300
    assert all(w.startswith(" ") and w[1:].isalpha() and w.islower() for w in vocab)
    for enc in ENCODINGS:
        assert all(count_text(w, enc) == 1 for w in vocab)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_concatenated_words_do_not_merge(encoding: str) -> None:
    """n words are exactly n tokens, whatever the encoding."""
    words, reason = generate_words(request_seed(b"prompt", None), 500)
    assert reason == "length" and len(words) == 500
    assert count_text("".join(words), encoding) == 500


def test_output_is_reproducible_per_prompt_and_seed() -> None:
    """Same prompt and seed give the same words; another seed gives others."""
    a = generate_words(request_seed(b"hello", 1), 20)[0]
    assert a == generate_words(request_seed(b"hello", 1), 20)[0]
    assert a != generate_words(request_seed(b"hello", 2), 20)[0]
    assert a != generate_words(request_seed(b"other", 1), 20)[0]


def test_stop_string_cuts_before_the_word() -> None:
    """A stop string ends the output before the word it starts in; finish reason 'stop'."""
    seed = request_seed(b"stop test", None)
    words, _ = generate_words(seed, 50)
    stop = words[10]
    first = words.index(stop)
    cut, reason = generate_words(seed, 50, [stop, "zzz-never"])
    assert reason == "stop"
    assert cut == words[:first]
    assert stop not in "".join(cut)


def test_stop_that_never_matches_keeps_length() -> None:
    words, reason = generate_words(request_seed(b"x", None), 10, ["\n\n"])
    assert (len(words), reason) == (10, "length")
