"""The route stage: model -> pool -> backend. Classes, pools and their queues, backend picking,
health and ejection, retry budgets and back-off, rollout versions (canary weights, sticky and
affinity keys from the conversation). Pure decisions; no HTTP."""
