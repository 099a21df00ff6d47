"""The Grafana dashboard and Prometheus config are valid and query metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from gateway.telemetry.metrics import Metrics
from tests.telemetry.fakes import FakeContext, FakeUsage, finished

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "gateway-dashboard.json"


def exposed_names() -> set[str]:
    """Every sample name /metrics can show, after touching every metric once."""
    m = Metrics(tenant_label=True)
    m.observe_request(finished(attempts=2, failovers=1), FakeUsage(), tenant="t",
                      queue_wait_s=0.1)
    m.observe_request(FakeContext(status=429))
    m.quota_rejected("rpm", "t")
    m.shadow(200)
    m.ejection("p", "b")
    m.set_inflight("p", "b", 1)
    m.set_queue_depth("p", 1)
    m.set_redis_up(True)
    m.set_rollout_step("m", "v", 5.0)
    m.rollout_transition("m", "v", "advanced")
    body = m.render()[0].decode()
    return {line.split("{")[0].split(" ")[0] for line in body.splitlines()
            if line and not line.startswith("#")}


def test_dashboard_is_valid_and_queries_real_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    names = exposed_names()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        for name in re.findall(r"\bgateway_[a-z_]+", expr):
            assert name in names, f"{name} (in {expr!r}) is not exposed"
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "prometheus"  # the provisioned datasource
    titles = " ".join(p["title"] for p in dash["panels"])
    for topic in ("TTFT", "TPOT", "Tokens/s", "Error rate", "Retries", "Queue", "Quota",
                  "Spend per tenant", "In-flight"):
        assert topic in titles, topic


def test_prometheus_scrapes_every_gateway_replica() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway = jobs["llm-gateway"]
    assert gateway["metrics_path"] == "/metrics"
    targets = [t for sc in gateway["static_configs"] for t in sc["targets"]]
    assert targets == ["gateway-1:8080", "gateway-2:8080"]
