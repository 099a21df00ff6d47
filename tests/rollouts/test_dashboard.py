"""The Grafana dashboard marks rollout transitions (an annotation) and plots the canary's
share, from metrics the gateway exposes."""

from __future__ import annotations

import json
import re

from tests.telemetry.test_deploy_files import DASHBOARD, exposed_names


def test_rollout_annotation_and_panels_query_real_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = exposed_names()
    annotations = [a for a in dash["annotations"]["list"] if "rollout" in a["name"].lower()]
    assert len(annotations) == 1
    assert annotations[0]["enable"] and annotations[0]["datasource"]["uid"] == "prometheus"
    exprs = [annotations[0]["expr"]] + [t["expr"] for p in dash["panels"]
                                        if "ollout" in p["title"] or "anary" in p["title"]
                                        for t in p.get("targets", [])]
    used = {n for e in exprs for n in re.findall(r"\bgateway_[a-z_]+", e)}
    assert used == {"gateway_rollout_transitions_total", "gateway_rollout_step"}
    assert used <= names
