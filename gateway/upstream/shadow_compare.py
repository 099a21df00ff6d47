"""Shadow answers compared: the agreement measures and the bounded store of comparisons.

A mirrored request leaves one :class:`Comparison` of the primary's answer with the shadow's.
Its ``outcome`` is one of three:

* ``error``: either side is not a complete 2xx answer (a status, a timeout, a broken stream,
  a primary the client left before its end); nothing is compared;
* ``agree``: the two texts are equal after whitespace normalisation (runs of whitespace read
  as one space, ends stripped), or their ROUGE-1 F is at least the shadow's
  ``agree_similarity``;
* ``disagree``: otherwise.

ROUGE-1 F is the word-multiset overlap ``2 * |A & B| / (|A| + |B|)`` over words: the text
case-folded, ASCII punctuation read as a space, split on whitespace. C-speed string passes and
one ``Counter`` per text, no model, no tokenizer: about 0.5 ms for two 16 KB texts (the cap),
tens of microseconds for answers of a few hundred tokens. 1.0 for equal bags of words, 0.0 for
no word in common (two empty answers: 1.0).

:class:`ShadowComparisons` keeps, per public model, the last ``keep`` comparisons (a ring, for
latency ratios, status mix and similarity quantiles) and the last ``examples`` disagreeing ones,
plus counts by (model, shadow version, outcome) since the process started. Nothing grows with
traffic: rings have fixed lengths and the model and version names come from the policy (past
``max_models`` the oldest model is forgotten). Comparisons carry no text; a disagreeing example
carries the two texts (each cut to ``EXAMPLE_CHARS``) only when the tenant's policy allows its
content to be recorded (``tenants[].record_content``, the switch traces use).
"""

from __future__ import annotations

import math
import string
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gateway.upstream.shadow_answer import Answer

__all__ = ["EXAMPLE_CHARS", "Comparison", "Outcome", "ShadowComparisons", "judge", "normalise",
           "rouge1_f"]

Outcome = Literal["agree", "disagree", "error"]
#: characters of each text a disagreeing example keeps (when its content may be recorded)
EXAMPLE_CHARS = 4096
_PUNCTUATION = str.maketrans(dict.fromkeys(string.punctuation, " "))
_OUTCOMES: tuple[Outcome, ...] = ("agree", "disagree", "error")


def normalise(text: str) -> str:
    """``text`` with every run of whitespace read as one space and its ends stripped."""
    return " ".join(text.split())


def rouge1_f(a: str, b: str) -> float:
    """ROUGE-1 F of two texts: ``2 * overlap / (words in a + words in b)``, in [0, 1]."""
    wa, wb = Counter(_words(a)), Counter(_words(b))
    total = wa.total() + wb.total()
    if total == 0:
        return 1.0
    return 2 * (wa & wb).total() / total


def _words(text: str) -> list[str]:
    return text.casefold().translate(_PUNCTUATION).split()


def judge(primary: Answer, shadow: Answer, agree_at: float
          ) -> tuple[Outcome, bool | None, float | None]:
    """(outcome, exact match, similarity) of two answers; None measures for an error."""
    if not (primary.ok and shadow.ok):
        return "error", None, None
    a, b = primary.text or "", shadow.text or ""
    if a.split() == b.split():  # normalise(a) == normalise(b), without joining
        return "agree", True, 1.0
    similarity = rouge1_f(a, b)
    return ("agree" if similarity >= agree_at else "disagree"), False, similarity


@dataclass(slots=True, kw_only=True)
class Comparison:
    """One mirrored request's two answers, judged. ``primary`` and ``shadow`` carry no text."""

    model: str
    #: the shadow's version label (``shadow.version``, else its backend model, else its pool)
    version: str
    #: the rollout version that served the primary, if the model has versions
    primary_version: str | None
    request_id: str
    tenant: str | None
    at: float  # wall-clock time, seconds
    outcome: Outcome
    exact: bool | None
    similarity: float | None
    primary: Answer
    shadow: Answer
    #: (primary text, shadow text) of a disagreeing example whose content may be recorded
    texts: tuple[str, str] | None = None

    @property
    def ttft_ratio(self) -> float | None:
        return _ratio(self.shadow.ttft_ms, self.primary.ttft_ms) if self.outcome != "error" \
            else None

    @property
    def duration_ratio(self) -> float | None:
        return _ratio(self.shadow.duration_ms, self.primary.duration_ms) \
            if self.outcome != "error" else None

    def view(self) -> dict[str, Any]:
        """The comparison for the admin report: texts only when they were kept."""
        out: dict[str, Any] = {
            "request_id": self.request_id, "tenant": self.tenant, "at": self.at,
            "version": self.version, "primary_version": self.primary_version,
            "outcome": self.outcome, "exact": self.exact, "similarity": self.similarity,
            "primary": self.primary.facts(), "shadow": self.shadow.facts(),
        }
        if self.texts is not None:
            out["primary"]["text"], out["shadow"]["text"] = self.texts
        else:
            out["content"] = "not recorded (the tenant's record_content is off)"
        return out


def _ratio(shadow: float | None, primary: float | None) -> float | None:
    if shadow is None or primary is None or primary <= 0:
        return None
    return shadow / primary


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile of unsorted values; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _rate(agree: int, disagree: int) -> float | None:
    return agree / (agree + disagree) if agree + disagree else None


@dataclass(slots=True)
class _Model:
    """One model's recent comparisons, disagreeing examples and counts by version."""

    recent: deque[Comparison]
    examples: deque[Comparison]
    counts: dict[str, dict[Outcome, int]] = field(default_factory=dict)


class ShadowComparisons:
    """The process's comparisons (one per process, kept across policy reloads).

    Read by the admin report (:meth:`summary`) and by rollout gates (:meth:`agreement`).
    """

    def __init__(self, *, keep: int = 256, examples: int = 5, max_models: int = 256,
                 max_versions: int = 32) -> None:
        self.keep, self.examples = keep, examples
        self.max_models, self.max_versions = max_models, max_versions
        self._models: dict[str, _Model] = {}

    def __repr__(self) -> str:
        compared = sum(sum(c.values()) for m in self._models.values() for c in m.counts.values())
        return f"<ShadowComparisons [models: {len(self._models)} | compared: {compared}]>"

    def add(self, comparison: Comparison) -> None:
        """Keep one comparison; its texts only if it disagrees and they were allowed."""
        model = self._model(comparison.model)
        if comparison.outcome != "disagree":
            comparison.texts = None
        model.recent.append(comparison)
        if comparison.outcome == "disagree":
            model.examples.append(comparison)
        counts = model.counts.get(comparison.version)
        if counts is None:
            if len(model.counts) >= self.max_versions:
                del model.counts[next(iter(model.counts))]
            counts = model.counts[comparison.version] = dict.fromkeys(_OUTCOMES, 0)
        counts[comparison.outcome] += 1

    def agreement(self, model: str, version: str | None = None) -> tuple[int, int]:
        """(agreeing, compared) since the process started, for one shadow version or all.

        ``compared`` counts agreeing and disagreeing comparisons; errors (either side not a
        complete 2xx answer) are not in it (see :meth:`counts`). Counts only grow, so a
        caller wanting a window takes the difference of two readings.
        """
        counts = self.counts(model, version)
        return counts["agree"], counts["agree"] + counts["disagree"]

    def ttfts(self, model: str, version: str, since: float
              ) -> tuple[list[float], list[float]]:
        """(primary, shadow) times to first token, seconds, of ``version``'s compared answers
        since wall-clock ``since``, both sides timed from the mirroring instant (the recent
        ones the store keeps: at most ``keep`` a model). Read by a shadow stage's TTFT gate."""
        entry = self._models.get(model)
        primary: list[float] = []
        shadow: list[float] = []
        for c in entry.recent if entry is not None else ():
            if c.version != version or c.at < since or c.outcome == "error":
                continue
            if c.primary.ttft_ms is not None and c.shadow.ttft_ms is not None:
                primary.append(c.primary.ttft_ms / 1000)
                shadow.append(c.shadow.ttft_ms / 1000)
        return primary, shadow

    def counts(self, model: str, version: str | None = None) -> dict[Outcome, int]:
        """Comparisons by outcome since the process started (one version, or all)."""
        entry = self._models.get(model)
        total = dict.fromkeys(_OUTCOMES, 0)
        if entry is None:
            return total
        for name, counts in entry.counts.items():
            if version is None or name == version:
                for outcome, n in counts.items():
                    total[outcome] += n
        return total

    def models(self) -> list[str]:
        return list(self._models)

    def summary(self, model: str) -> dict[str, Any]:
        """Agreement, latency ratios, output-token ratio, status mix and disagreeing examples
        of one model, JSON-ready."""
        entry = self._models.get(model)
        recent = list(entry.recent) if entry is not None else []
        counts = self.counts(model)
        return {
            "model": model,
            "compared": counts,
            "agreement_rate": _rate(counts["agree"], counts["disagree"]),
            "versions": {
                name: {**c, "agreement_rate": _rate(c["agree"], c["disagree"])}
                for name, c in (entry.counts.items() if entry is not None else ())
            },
            "window": _window(recent),
            "disagreeing": [c.view() for c in (entry.examples if entry is not None else ())],
        }

    def _model(self, name: str) -> _Model:
        entry = self._models.get(name)
        if entry is None:
            if len(self._models) >= self.max_models:
                del self._models[next(iter(self._models))]
            entry = self._models[name] = _Model(deque(maxlen=self.keep),
                                                deque(maxlen=self.examples))
        return entry


def _window(recent: list[Comparison]) -> dict[str, Any]:
    """Figures over the last comparisons kept: latencies of the pairs compared (both sides
    complete), the output-token ratio, similarity quantiles and the status mix of all."""
    both = [c for c in recent if c.outcome != "error"]
    tokens = [(c.primary.output_tokens, c.shadow.output_tokens) for c in both
              if c.primary.output_tokens is not None and c.shadow.output_tokens is not None]
    primary_tokens = sum(p for p, _ in tokens)
    similarities = [c.similarity for c in both if c.similarity is not None]
    finish = [c for c in both if c.primary.finish_reason is not None]
    return {
        "comparisons": len(recent),
        "ttft": _latency([(c.primary.ttft_ms, c.shadow.ttft_ms) for c in both]),
        "duration": _latency([(c.primary.duration_ms, c.shadow.duration_ms) for c in both]),
        "output_tokens_ratio": (sum(s for _, s in tokens) / primary_tokens
                                if primary_tokens else None),
        "similarity": {"p10": _quantile(similarities, 0.1), "p50": _quantile(similarities, 0.5),
                       "mean": sum(similarities) / len(similarities) if similarities else None},
        "finish_reason_match": (sum(c.primary.finish_reason == c.shadow.finish_reason
                                    for c in finish) / len(finish) if finish else None),
        "status": {"primary": _statuses(c.primary for c in recent),
                   "shadow": _statuses(c.shadow for c in recent)},
    }


def _latency(pairs: list[tuple[float | None, float | None]]) -> dict[str, float | None]:
    """p50/p90 of each side (ms) over the pairs where both are known, and shadow / primary."""
    known = [(p, s) for p, s in pairs if p is not None and s is not None]
    out: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p90", 0.9)):
        primary = _quantile([p for p, _ in known], q)
        shadow = _quantile([s for _, s in known], q)
        out[f"primary_{name}_ms"], out[f"shadow_{name}_ms"] = primary, shadow
        out[f"ratio_{name}"] = _ratio(shadow, primary)
    return out


def _statuses(answers: Iterable[Answer]) -> dict[str, int]:
    """Answers by status (``none``: no answer: connect error, timeout, cut off)."""
    mix: dict[str, int] = {}
    for answer in answers:
        key = "none" if answer.status is None else str(answer.status)
        mix[key] = mix.get(key, 0) + 1
    return mix
