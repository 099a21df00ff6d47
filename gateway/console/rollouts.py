"""The operator's rollouts: each progressive rollout with its steps, current step, gates and
phase on the operator's page, and its actions.

``POST /console/operator/rollouts`` (``model``, ``action``: ``pause``, ``resume``, ``promote``
or ``abort``, the page's "roll back"): :meth:`Rollouts.act`, the call behind
``POST /admin/rollouts/<model>/<action>`` and ``gateway rollout``, by ``console``; written to
the admin audit log. An unknown model answers 404, an action that does not apply to the
rollout's phase 409, a rollout store that does not answer 503; each with the operator's page
link. The model is a form field, not a path segment (model names may hold slashes).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from litestar import Response, post

from gateway.console.kit import AnyRequest, Kit, client_host
from gateway.rollouts import ACTIONS, InvalidAction, RolloutStoreUnavailable, UnknownRollout

if TYPE_CHECKING:
    from gateway.rollouts import Rollouts

__all__ = ["figures_text", "rollout_handlers", "rollout_rows"]

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
        client = client_host(request)
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
