"""Budget alerts out of the quota store: a log event, a metric and a signed webhook each.

:class:`BudgetAlerts` is the quota store's alert sink (``gateway.quota.alerts``): the store has
already decided that an alert fires (once per budget, period and threshold across replicas);
this tells people. Per alert it writes a ``budget_alert`` log event (the fields of
:func:`payload`, the alert's level as ``budget_level``), counts
``gateway_budget_alerts_total{level,threshold}``, and, when the alert settings of the alert's
organization (or the policy's, outside organizations) name a webhook, queues a POST of
:func:`payload` to it (``webhook.py``). None of it blocks or awaits: the sink runs inside a
settle or a refusal, and the request never waits for a webhook.

The webhook URL and secret are read from the environment variables the policy names, at each
alert (so a reload or a rotated secret applies at once); an unset variable logs once and sends
nothing. Neither value is ever logged.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.alerts.webhook import Delivery, WebhookSender
from gateway.telemetry import get_logger

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from gateway.config import Alerts
    from gateway.quota.alerts import BudgetAlert
    from gateway.telemetry import Metrics

__all__ = ["BudgetAlerts", "payload"]

_encode = msgspec.json.Encoder().encode


def payload(alert: BudgetAlert, currency: str) -> dict[str, Any]:
    """The webhook body of one alert (also the fields of its log event).

    ``used`` and ``limit`` are tokens, or for a spend budget (``unit: "cost"``) integer
    micro-units of ``currency`` (1,000,000 = one unit).
    """
    body: dict[str, Any] = {
        "type": "budget.threshold",
        "id": alert.id,
        "level": alert.level,
        "subject": alert.subject,
        "organization": alert.organization,
        "tenant": alert.tenant,
        "budget": alert.budget,
        "period": alert.period,
        "timezone": alert.timezone,
        "threshold": alert.threshold,
        "used": alert.used,
        "limit": alert.limit,
        "unit": alert.unit,
        "trigger": alert.trigger,
        "at": datetime.fromtimestamp(alert.at, UTC).isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
    }
    if alert.unit == "cost":
        body["currency"] = currency
    return body


class BudgetAlerts:
    """The quota store's alert sink.

    Args:
        settings: the alert settings of an organization (``None``: of tenants outside any),
            from the policy in force (``Runtime.alerts_for``).
        sender: the webhook queue (started and stopped with the app).
        metrics: where ``gateway_budget_alerts_total`` is counted (None: nowhere).
        currency: the price currency, for spend budgets' alerts.
        env: where the webhook variables are read (the process environment).
    """

    def __init__(self, settings: Callable[[str | None], Alerts], sender: WebhookSender, *,
                 metrics: Metrics | None = None, currency: Callable[[], str] = lambda: "USD",
                 env: Mapping[str, str] | None = None) -> None:
        self._settings = settings
        self.sender = sender
        self._metrics = metrics
        self._currency = currency
        self._env = os.environ if env is None else env
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"<BudgetAlerts {self.sender!r}>"

    def __call__(self, alerts: Sequence[BudgetAlert]) -> None:
        for alert in alerts:
            self._one(alert)

    def start(self) -> None:
        self.sender.start()

    async def aclose(self) -> None:
        await self.sender.aclose()

    def _one(self, alert: BudgetAlert) -> None:
        body = payload(alert, self._currency())
        # looked up per alert (they are rare): a logger cached at import would keep the
        # logging set-up of that moment
        log = get_logger("gateway.budgets")
        # ``level`` is the log line's own field: the alert's goes in as ``budget_level``
        fields = {("budget_level" if k == "level" else k): v for k, v in body.items()
                  if k != "type"}
        log.warning("budget_alert", **fields)
        if self._metrics is not None:
            self._metrics.budget_alert(alert.level, alert.threshold)
        settings = self._settings(alert.organization)
        if settings.webhook_url_env is None or settings.webhook_secret_env is None:
            return
        url = self._env.get(settings.webhook_url_env, "")
        secret = self._env.get(settings.webhook_secret_env, "")
        if not url or not secret:
            missing = settings.webhook_url_env if not url else settings.webhook_secret_env
            if missing not in self._warned:
                self._warned.add(missing)
                log.error("budget_alert_webhook_unset", variable=missing)
            return
        self.sender.submit(Delivery(url, secret.encode(), _encode(body), alert.id))
