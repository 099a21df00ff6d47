"""``/admin/rollouts``: progressive canaries for operators (behind the admin gate).

=======================================  ==================================================
``GET /admin/rollouts``                  every rollout: phase, step, share, time in step
``GET /admin/rollouts/<model>``          one rollout with its window's counts, each gate's
                                         verdict and figures, and its transition history
``POST /admin/rollouts/<model>/pause``   hold the current share; no gate decides meanwhile
``POST /admin/rollouts/<model>/resume``  decide again, in a fresh window at the same step
``POST /admin/rollouts/<model>/promote`` the canary takes 100% now
``POST /admin/rollouts/<model>/abort``   the canary takes 0% now (the rollout stops)
=======================================  ==================================================

A model name may hold slashes (``meta-llama/Llama-3.1-8B``): the path after
``/admin/rollouts/`` is the model, and for a POST its last segment is the action. Answers:
404 for a model without a progressive version, 400 for an unknown action, 409 for an action
that does not apply to the rollout's phase (resume when it is not paused, ...), 503 when the
rollout store (Redis) does not answer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from litestar import get, post

from gateway.errors import GatewayError, InvalidRequest, RouteNotFound
from gateway.rollouts import ACTIONS, InvalidAction, RolloutStoreUnavailable, UnknownRollout

if TYPE_CHECKING:
    from gateway.rollouts import Rollouts

__all__ = ["RolloutConflict", "RolloutsUnavailable", "rollout_handlers"]

_log = logging.getLogger("gateway.admin")


class RolloutConflict(GatewayError):
    """The action does not apply to the rollout's phase now."""

    status: ClassVar[int] = 409
    type: ClassVar[str] = "invalid_request_error"
    code: ClassVar[str | None] = "rollout_conflict"


class RolloutsUnavailable(GatewayError):
    """The rollout store (Redis) did not answer."""

    status: ClassVar[int] = 503
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = "rollout_store_unavailable"


def _unknown(model: str) -> RouteNotFound:
    return RouteNotFound(f"no progressive rollout for model {model!r}")


def rollout_handlers(rollouts: Rollouts) -> list[Any]:
    """Route handlers of ``/admin/rollouts``, bound to one gateway's rollouts."""

    @get("/admin/rollouts")
    async def listing() -> list[dict[str, Any]]:
        try:
            return await rollouts.listing()
        except RolloutStoreUnavailable as exc:
            raise RolloutsUnavailable(str(exc)) from None

    @get("/admin/rollouts/{rest:path}")
    async def one(rest: str) -> dict[str, Any]:
        model = rest.strip("/")
        try:
            return await rollouts.view(model)
        except UnknownRollout:
            raise _unknown(model) from None
        except RolloutStoreUnavailable as exc:
            raise RolloutsUnavailable(str(exc)) from None

    @post("/admin/rollouts/{rest:path}", status_code=200)
    async def action(rest: str) -> dict[str, Any]:
        model, _, verb = rest.strip("/").rpartition("/")
        if verb not in ACTIONS:
            raise InvalidRequest(f"unknown rollout action {verb!r}: POST "
                                 f"/admin/rollouts/<model>/<{'|'.join(ACTIONS)}>")
        try:
            state = await rollouts.act(model, verb, "admin")
            _log.info("admin: rollout %s %s -> %s at %g%%", model, verb, state.phase,
                      state.share)
            return await rollouts.view(model)
        except UnknownRollout:
            raise _unknown(model) from None
        except InvalidAction as exc:
            raise RolloutConflict(str(exc)) from None
        except RolloutStoreUnavailable as exc:
            raise RolloutsUnavailable(str(exc)) from None

    return [listing, one, action]
