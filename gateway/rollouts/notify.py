"""What a transition tells the world: a log event, two metrics, and an optional signed webhook.

Only the replica that made a transition (the decider, or the one an operator called) reports
it, so the counter and the webhook see each transition once across replicas. The webhook
reuses the budget alerts' sender (:mod:`gateway.alerts.webhook`: bounded queue, HMAC
signature, back-off), with ``X-Gateway-Event: rollout.transition`` and the delivery id
``<model>:<revision>``, the same on every retry.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING

from gateway.alerts.webhook import Delivery

if TYPE_CHECKING:
    from gateway.alerts.webhook import WebhookSender
    from gateway.config.model import Progressive
    from gateway.rollouts.machine import RolloutState
    from gateway.telemetry import Metrics

__all__ = ["EVENT", "Notifier"]

EVENT = "rollout.transition"
_log = logging.getLogger("gateway.rollouts")


class Notifier:
    """Reports transitions; ``webhooks`` None sends none."""

    def __init__(self, metrics: Metrics | None, webhooks: WebhookSender | None) -> None:
        self.metrics = metrics
        self.webhooks = webhooks

    def transition(self, state: RolloutState, definition: Progressive | None) -> None:
        entry = state.history[-1] if state.history else {}
        reason = str(entry.get("reason", ""))
        _log.info("rollout.transition model=%s version=%s from=%s to=%s step=%d share=%g "
                  "reason=%s by=%s revision=%d", state.model, state.version,
                  entry.get("from"), state.phase, state.step, state.share, reason,
                  entry.get("by"), state.revision)
        if self.metrics is not None:
            self.metrics.rollout_transition(state.model, state.version, reason)
            self.step(state)
        if self.webhooks is not None and definition is not None:
            self._webhook(state, definition, entry)

    def step(self, state: RolloutState) -> None:
        if self.metrics is not None:
            self.metrics.set_rollout_step(state.model, state.version, state.share)

    def _webhook(self, state: RolloutState, definition: Progressive,
                 entry: dict[str, object]) -> None:
        assert self.webhooks is not None
        url = os.environ.get(definition.webhook_url_env or "")
        if not url:
            return
        secret = os.environ.get(definition.webhook_secret_env or "", "")
        body = json.dumps({"event": EVENT, "model": state.model, "version": state.version,
                           "phase": str(state.phase), "step": state.step,
                           "share": state.share, "revision": state.revision,
                           "transition": entry}).encode()
        self.webhooks.start()
        self.webhooks.submit(Delivery(url, secret.encode(), body,
                                      f"{state.model}:{state.revision}", EVENT))
