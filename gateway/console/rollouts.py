"""The operator's rollouts: each progressive rollout with its steps, current step, gates and
phase on the operator's page, and its actions.

``POST /console/operator/rollouts`` (``model``, ``action``: ``pause``, ``resume``, ``promote``
or ``abort``, the page's "roll back"): :meth:`Rollouts.act`, the call behind
``POST /admin/rollouts/<model>/<action>`` and ``gateway rollout``, by ``console``; written to
the admin audit log. An unknown model answers 404, an action that does not apply to the
rollout's phase 409, a rollout store that does not answer 503; each with the operator's page
link. The model is a form field, not a path segment (model names may hold slashes).

Each rollout's gates are also charted (:func:`gate_chart`): per gate (and request class) its
canary figure and its baseline's as a percentage of the gate's threshold, so gates of
different units share one axis (the threshold is 100 %); the figures themselves go along for
the tooltips.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from litestar import Response, post

from gateway.console.kit import AnyRequest, Kit
from gateway.rollouts import ACTIONS, InvalidAction, RolloutStoreUnavailable, UnknownRollout

if TYPE_CHECKING:
    from gateway.rollouts import Rollouts

__all__ = ["figures_text", "gate_chart", "rollout_handlers", "rollout_rows"]

_log = logging.getLogger("gateway.admin")
#: the actions each phase offers (the state machine refuses the others with a 409)
_OFFERED = {"pending": ("pause", "promote", "abort"),
            "progressing": ("pause", "promote", "abort"),
            "paused": ("resume", "promote", "abort"),
            "rolled_back": ("promote",), "aborted": ("promote",), "promoted": ()}
LABELS = {"pause": "Pause", "resume": "Resume", "promote": "Promote", "abort": "Roll back"}


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def figures_text(gate: dict[str, Any]) -> str:
    """A gate's figures as one line (``name`` and ``verdict`` left out)."""
    return "; ".join(f"{k} {_value(v)}" for k, v in gate.items()
                     if k not in ("name", "verdict"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _bar(name: str, figures: dict[str, Any]) -> tuple[float | None, float | None,
                                                      float | None, str] | None:
    """(canary, baseline, threshold, what the threshold is) of one gate's figures; None for
    a gate the chart does not know."""
    get = figures.get
    if name == "error_rate":
        base, margin = _number(get("baseline")), _number(get("max_increase"))
        limit = base + margin if base is not None and margin is not None else None
        return _number(get("canary")), base, limit, "at most the baseline's + max_increase"
    if name in ("ttft_p90", "tpot_p90"):
        base, ratio = _number(get("baseline_p90")), _number(get("max_ratio"))
        limit = _number(get("threshold"))
        if limit is None and base is not None and ratio is not None:
            limit = base * ratio
        return _number(get("canary_p90")), base, limit, "at most max_ratio x the baseline's (ms)"
    if name == "output_tokens":
        base, change = _number(get("baseline_mean")), _number(get("max_change"))
        limit = base * (1 + change) if base is not None and change is not None else None
        return (_number(get("canary_mean")), base, limit,
                "at most (1 + max_change) x the baseline's mean")
    if name == "shadow_agreement":
        return _number(get("rate")), None, _number(get("min")), "at least min"
    return None


def _share(value: float | None, threshold: float | None) -> float | None:
    if value is None or not threshold:
        return None
    return round(value / threshold * 100, 1)


def gate_chart(gates: list[dict[str, Any]]) -> dict[str, Any]:
    """A rollout's gates as bars: per gate (per request class for the per-class gates) the
    canary's figure and the baseline's as % of the threshold (None where not measured yet),
    with the figures for the tooltips."""
    labels: list[str] = []
    canary: list[float | None] = []
    baseline: list[float | None] = []
    threshold: list[float | None] = []
    figures: list[dict[str, Any]] = []
    for gate in gates:
        name = str(gate.get("name", ""))
        classes = gate.get("classes")
        items = ([(f"{name} ({c})", f) for c, f in sorted(classes.items())
                  if isinstance(f, dict)] if isinstance(classes, dict) else [(name, gate)])
        for label, of_class in items:
            bar = _bar(name, of_class)
            if bar is None:
                continue
            can, base, limit, rule = bar
            labels.append(label)
            canary.append(_share(can, limit))
            baseline.append(_share(base, limit))
            threshold.append(100.0 if limit else None)
            figures.append({"canary": can, "baseline": base, "threshold": limit, "rule": rule,
                            "verdict": of_class.get("verdict", gate.get("verdict", ""))})
    return {"labels": labels, "canary": canary, "baseline": baseline,
            "threshold": threshold, "figures": figures}


async def rollout_rows(rollouts: Rollouts | None) -> list[dict[str, Any]] | str:
    """Every rollout's view (the admin API's ``GET /admin/rollouts/<model>``) with its gates'
    figures as text and the actions its phase offers; or why they could not be read."""
    if rollouts is None:
        return "Rollouts are not available to the console."
    rows = []
    try:
        for model in rollouts.models():
            view = await rollouts.view(model)
            view["gate_rows"] = [{"name": g.get("name", ""), "verdict": g.get("verdict", ""),
                                  "figures": figures_text(g)} for g in view.get("gates", [])]
            view["gate_chart"] = gate_chart(view.get("gates", []))
            view["actions"] = [(a, LABELS[a]) for a in _OFFERED.get(view["phase"], ACTIONS)]
            rows.append(view)
    except RolloutStoreUnavailable as exc:
        return f"The rollout store is not answering: {exc}"
    return rows


def rollout_handlers(kit: Kit) -> list[Any]:
    """The rollout actions of the operator's page."""

    @post("/console/operator/rollouts", status_code=303)
    async def act(request: AnyRequest) -> Response[Any]:
        posted = await kit.posted(request, role="operator")
        if not isinstance(posted, tuple):
            return posted
        session, form = posted
        model, verb = form.get("model", ""), form.get("action", "")
        rollouts = kit.services.rollouts
        client = kit.client(request)
        if verb not in ACTIONS:
            return kit.refuse(400, f"Unknown rollout action {verb[:32]!r}.", session)
        if rollouts is None:
            return kit.refuse(503, "Rollouts are not available to the console.", session)
        path = "/console/operator/rollouts"
        try:
            state = await rollouts.act(model, verb, "console")
        except UnknownRollout:
            kit.services.audit.record(path, client, "operator",
                                      f"rollout {model[:128]} {verb}: no such rollout", 404)
            return kit.refuse(404, f"No progressive rollout for model {model[:128]!r}.",
                              session)
        except InvalidAction as exc:
            kit.services.audit.record(path, client, "operator",
                                      f"rollout {model} {verb} refused: {exc}", 409)
            return kit.refuse(409, str(exc), session)
        except RolloutStoreUnavailable as exc:
            return kit.refuse(503, f"The rollout store is not answering: {exc}", session)
        _log.info("console: rollout %s %s -> %s at %g%%", model, verb, state.phase, state.share)
        kit.services.audit.record(path, client, "operator",
                                  f"rollout {model} {verb} -> {state.phase} at "
                                  f"{state.share:g}%", 303)
        return Response("", status_code=303, headers={"location": "/console/operator#rollouts"})

    return [act]
