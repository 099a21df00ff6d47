"""Budget alerts leave the gateway here: log events, metrics and signed webhooks.

The quota store decides *that* a threshold alert fires (``gateway.quota.alerts``, once per
budget, period and threshold across replicas); :class:`BudgetAlerts` (``dispatch.py``) is the
sink it hands them to, and :class:`WebhookSender` (``webhook.py``) makes the signed POSTs from
a bounded queue, off the request path.
"""

from __future__ import annotations

from gateway.alerts.dispatch import BudgetAlerts, payload
from gateway.alerts.webhook import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    Delivery,
    Outcome,
    WebhookSender,
    sign,
    verify,
)

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "BudgetAlerts",
    "Delivery",
    "Outcome",
    "WebhookSender",
    "payload",
    "sign",
    "verify",
]
