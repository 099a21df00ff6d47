"""Load shedding: refuse at once a request that cannot start in time, instead of letting it wait.

Why: past its capacity a pool that queues everything serves every request late; one that
refuses the excess at once serves the rest in time, and the refused client gets a 503 with a
``Retry-After`` while it can still go elsewhere. The decision is a pure function of the pool's
prediction (:mod:`gateway.routing.predict`); the router calls it and raises
:class:`~gateway.routing.errors.RequestShed`.

The reasons, in order:

- never when the pool has room: nothing ahead of the request (``ahead == 0``) means waiting is
  not what would make it late, so it is sent, however long its own prompt;
- ``deadline``: the predicted time to first token exceeds ``margin`` x the time left before the
  class's start deadline;
- ``priority``: a higher class (one with a ``ttft_target``) used the pool recently and the
  prediction already exceeds that target. Admitting a lower-class prompt now would put its
  prefill ahead of that class's next requests, so batch is shed before interactive: from the
  interactive target on, while interactive itself is shed only from its own deadline.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.routing.predict import Prediction

__all__ = ["REASONS", "retry_after", "shed_reason"]

REASONS = ("deadline", "priority")
_ROOM = 1e-3  # seconds ahead below which the pool counts as having room


def shed_reason(prediction: Prediction, left: float, margin: float,
                pressure: float | None = None) -> str | None:
    """Why a request should be refused now, or None to let it through.

    ``left``: seconds until its start deadline; ``pressure``: the lowest ``ttft_target`` of a
    higher class active in the pool (None: none).
    """
    if prediction.ahead < _ROOM:
        return None
    if prediction.ttft > margin * left:
        return "deadline"
    if pressure is not None and prediction.ttft > pressure:
        return "priority"
    return None


def retry_after(prediction: Prediction) -> int:
    """Whole seconds to suggest: about the time the work ahead needs to drain (1 to 60)."""
    return max(1, math.ceil(min(60.0, prediction.ahead)))  # inf: no healthy backend
