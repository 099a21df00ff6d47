"""deploy/kubernetes: every kustomization renders, every object passes the Kubernetes OpenAPI
schema (kubernetes-validate, strict), and the objects fit together."""

from __future__ import annotations

import base64
import functools
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.config import load_policy, parse_policy
from tests.deploy._util import KUSTOMIZE_DIRS, render_kustomization

pytestmark = pytest.mark.process

#: Kubernetes versions validated against: the oldest we claim to support and the newest schema
K8S_VERSIONS = ("1.29.0", "1.37.0")
PRESTOP_SLEEP = 5
#: the init container that migrates the ledger schema before the gateway starts
MIGRATE_COMMAND = ["gateway", "db", "migrate", "--config", "/etc/gateway/policies"]
SECRET = "llm-gateway-secrets"

#: minimal schema for the one CRD kind (kubernetes-validate carries no CRD schemas)
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {"matchLabels": {"type": "object"}},
                },
                "namespaceSelector": {"type": "object"},
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}


@functools.cache
def _render(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(render_kustomization(KUSTOMIZE_DIRS[name]))


def rendered(name: str) -> list[dict[str, Any]]:
    return list(_render(name))


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def gateway_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deploy = one(docs, "Deployment", "llm-gateway")
    containers = deploy["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment", "llm-gateway")["spec"]["template"]["spec"]
    return spec


def init_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    inits = pod_spec(docs).get("initContainers", [])
    found = [c for c in inits if c["name"] == "ledger-migrate"]
    assert len(found) == 1, f"expected the ledger-migrate init container, found {inits}"
    return found[0]


def secret_ref(container: dict[str, Any], var: str) -> dict[str, Any]:
    env = {e["name"]: e for e in container.get("env", [])}
    assert var in env, f"{container['name']}: no {var}"
    ref: dict[str, Any] = env[var]["valueFrom"]["secretKeyRef"]
    return ref


def mount_for(container: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The deepest volume mount of the container that holds ``path``."""
    holding = [m for m in container.get("volumeMounts", [])
               if PurePosixPath(path).is_relative_to(m["mountPath"])]
    return max(holding, key=lambda m: len(m["mountPath"]), default=None)


def policy_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cms = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("llm-gateway-policies")
    ]
    assert len(cms) == 1
    (text,) = cms[0]["data"].values()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", list(KUSTOMIZE_DIRS))
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_schema_valid(overlay: str, version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    jsonschema = pytest.importorskip("jsonschema")
    for doc in rendered(overlay):
        what = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            # a CRD: the Kubernetes schemas do not know it; check our minimal schema instead
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{overlay}: {what} is invalid for Kubernetes {version}: {exc.message}")


@pytest.mark.parametrize("overlay", list(KUSTOMIZE_DIRS))
def test_deployment_probes_drain_and_security(overlay: str) -> None:
    docs = rendered(overlay)
    deploy = one(docs, "Deployment", "llm-gateway")
    pod = deploy["spec"]["template"]["spec"]
    c = gateway_container(docs)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(PRESTOP_SLEEP)]
    drain = policy_of(docs)["server"]["drain_timeout"]
    assert pod["terminationGracePeriodSeconds"] >= PRESTOP_SLEEP + drain + 5
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's USER
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    args = c["args"]
    assert args[args.index("--config") + 1] == "/etc/gateway/policies"
    assert "command" not in c, "use the image's ENTRYPOINT (gateway serve)"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["policies"] == "/etc/gateway/policies" and mounts["tmp"] == "/tmp"
    volumes = {v["name"]: v for v in pod["volumes"]}
    cm_name = volumes["policies"]["configMap"]["name"]
    one(docs, "ConfigMap", cm_name)  # the generated (hash-suffixed) name is referenced
    env = {e["name"]: e for e in c["env"]}
    for var in ("GATEWAY_ADMIN_TOKEN", "GATEWAY_REDIS_URL", "GATEWAY_LEDGER_URL"):
        assert "secretKeyRef" in env[var]["valueFrom"], f"{var} must come from a Secret"


@pytest.mark.parametrize("overlay", list(KUSTOMIZE_DIRS))
def test_ledger_url_comes_from_the_secret(overlay: str) -> None:
    docs = rendered(overlay)
    ref = secret_ref(gateway_container(docs), "GATEWAY_LEDGER_URL")
    assert ref["name"].startswith(SECRET) and ref["key"] == "ledger-url"
    assert not ref.get("optional"), "the ledger of record is not optional"
    assert secret_ref(gateway_container(docs), "GATEWAY_REDIS_URL")["name"] == ref["name"]


@pytest.mark.parametrize("overlay", list(KUSTOMIZE_DIRS))
def test_init_container_migrates_the_ledger_first(overlay: str) -> None:
    docs = rendered(overlay)
    gateway, init = gateway_container(docs), init_container(docs)
    assert pod_spec(docs)["initContainers"] == [init], "the only init container"
    assert init["image"] == gateway["image"]
    assert init.get("imagePullPolicy") == gateway.get("imagePullPolicy")
    assert init["command"] == MIGRATE_COMMAND and "args" not in init
    assert secret_ref(init, "GATEWAY_LEDGER_URL") == secret_ref(gateway, "GATEWAY_LEDGER_URL")
    assert init["securityContext"] == gateway["securityContext"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(init["resources"][kind])
    policies = mount_for(init, "/etc/gateway/policies")
    assert policies == mount_for(gateway, "/etc/gateway/policies")
    assert policies and policies["readOnly"] is True
    # opening the ledger creates store.spool_dir: writable in the init container too
    spool = mount_for(init, policy_of(docs)["store"]["spool_dir"])
    assert spool and not spool.get("readOnly"), "the init container cannot create the spool"


@pytest.mark.parametrize("overlay", list(KUSTOMIZE_DIRS))
def test_spool_is_on_a_disk_volume(overlay: str) -> None:
    docs = rendered(overlay)
    store = policy_of(docs)["store"]
    gateway = gateway_container(docs)
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    spool = mount_for(gateway, store["spool_dir"])
    assert spool and spool["mountPath"] != "/tmp", f"spool_dir {store['spool_dir']} unmounted"
    assert not spool.get("readOnly")
    assert mount_for(gateway, store["data_dir"]) == spool
    volume = volumes[spool["name"]]
    assert "emptyDir" in volume, volume
    # fsync'd records on tmpfs would count against the memory limit: the node's disk
    assert volume["emptyDir"].get("medium", "") == "", "the spool must not be in memory"
    assert volume["emptyDir"].get("sizeLimit"), "an unbounded spool can fill the node's disk"


def test_every_container_meets_pod_security_restricted() -> None:
    """The namespaces enforce Pod Security "restricted": every pod of every overlay passes."""
    for overlay in KUSTOMIZE_DIRS:
        for doc in rendered(overlay):
            if doc["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = doc["spec"]["template"]["spec"]
            what = f"{overlay}: {doc['kind']}/{doc['metadata']['name']}"
            assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", what
            assert pod["securityContext"]["runAsNonRoot"] is True, what
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False, f"{what} {c['name']}"
                assert sc["capabilities"]["drop"] == ["ALL"], f"{what} {c['name']}"
                assert not sc.get("capabilities", {}).get("add"), f"{what} {c['name']}"
                assert sc.get("runAsNonRoot", True) is True, f"{what} {c['name']}"
                assert sc.get("readOnlyRootFilesystem") is True, f"{what} {c['name']}"


@pytest.mark.parametrize("overlay", list(KUSTOMIZE_DIRS))
def test_policy_config_map_is_valid_and_keys_come_from_secrets(
    overlay: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    docs = rendered(overlay)
    data = policy_of(docs)
    parse_policy(data, f"{overlay}:ConfigMap llm-gateway-policies")
    env = {e["name"]: e for e in gateway_container(docs)["env"]}
    names = {k["key_env"] for k in data["auth"]["keys"] if "key_env" in k}
    names |= {b["api_key_env"] for p in data["pools"] for b in p["backends"] if "api_key_env" in b}
    for name in names:
        assert name in env and "secretKeyRef" in env[name]["valueFrom"], name
    # the full loader (cross references, keys resolve) with the env the pod would have
    for name in names:
        monkeypatch.setenv(name, f"test-{name}")
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    load_policy(path)


@pytest.mark.parametrize("overlay", list(KUSTOMIZE_DIRS))
def test_service_hpa_pdb_servicemonitor_select_the_pods(overlay: str) -> None:
    docs = rendered(overlay)
    deploy = one(docs, "Deployment", "llm-gateway")
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert matches(deploy["spec"]["selector"]["matchLabels"], pod_labels)
    svc = one(docs, "Service", "llm-gateway")
    assert matches(svc["spec"]["selector"], pod_labels)
    port_names = {p["name"] for p in gateway_container(docs)["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names
    hpa = one(docs, "HorizontalPodAutoscaler", "llm-gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", "llm-gateway")
    assert hpa["spec"]["minReplicas"] <= deploy["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    pdb = one(docs, "PodDisruptionBudget", "llm-gateway")
    assert matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    for sm in monitors:
        assert matches(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
            assert ep["path"] == "/metrics"
    assert bool(monitors) == (overlay != "dev")


def test_example_overlay_namespace_replicas_image() -> None:
    docs = rendered("example")
    ns = one(docs, "Namespace")["metadata"]["name"]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == ns, f"{doc['kind']} outside {ns}"
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    image = gateway_container(docs)["image"]
    repo, _, tag = image.rpartition(":")
    assert "/" in repo and tag and tag != "latest", image
    base_image = gateway_container(rendered("base"))["image"]
    assert base_image != image


def test_dev_overlay_brings_redis_postgres_and_their_secret() -> None:
    docs = rendered("dev")
    sts = one(docs, "StatefulSet", "redis-dev")
    svc = one(docs, "Service", "redis-dev")
    assert matches(svc["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    env = {e["name"]: e for e in gateway_container(docs)["env"]}
    secret_name = env["GATEWAY_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"]
    secret = one(docs, "Secret", secret_name)  # generated name, rewritten in the Deployment
    url = base64.b64decode(secret["data"]["redis-url"]).decode()
    assert url.startswith("redis://redis-dev:6379")
    refs = {
        ref["key"]
        for e in env.values()
        if (ref := e.get("valueFrom", {}).get("secretKeyRef")) and not ref.get("optional")
    }
    assert refs <= set(secret["data"]), f"dev Secret lacks {refs - set(secret['data'])}"


def test_dev_postgres_matches_the_ledger_url() -> None:
    docs = rendered("dev")
    sts = one(docs, "StatefulSet", "postgres-dev")
    svc = one(docs, "Service", "postgres-dev")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert matches(svc["spec"]["selector"], pod_labels)
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    (pg,) = sts["spec"]["template"]["spec"]["containers"]
    repo, _, tag = pg["image"].partition(":")
    assert repo == "postgres" and tag and tag != "latest"
    ports = {p["name"]: p["containerPort"] for p in pg["ports"]}
    (svc_port,) = svc["spec"]["ports"]
    assert ports[svc_port["targetPort"]] == svc_port["port"] == 5432
    env = {e["name"]: e for e in pg["env"]}
    ledger_ref = secret_ref(gateway_container(docs), "GATEWAY_LEDGER_URL")
    password_ref = secret_ref(pg, "POSTGRES_PASSWORD")
    assert password_ref["name"] == ledger_ref["name"], "one generated Secret for both"
    secret = one(docs, "Secret", ledger_ref["name"])

    def value(key: str) -> str:
        return base64.b64decode(secret["data"][key]).decode()

    url = urlsplit(value(ledger_ref["key"]))
    assert url.scheme == "postgresql"
    assert (url.hostname, url.port) == (svc["metadata"]["name"], svc_port["port"])
    assert url.username == env["POSTGRES_USER"]["value"]
    assert url.path == "/" + env["POSTGRES_DB"]["value"]
    assert url.password == value(password_ref["key"])
    # the data lives on the claim, in a subdirectory (a volume's root may hold lost+found)
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    data = mount_for(pg, env["PGDATA"]["value"])
    assert data and data["name"] == claim["metadata"]["name"]
    assert env["PGDATA"]["value"] != data["mountPath"]
    # read-only root: the socket directory must be a volume
    run = mount_for(pg, "/var/run/postgresql/.s.PGSQL.5432")
    assert run and run["mountPath"] == "/var/run/postgresql"
    probe = pg["readinessProbe"]["exec"]["command"]
    assert probe[0] == "pg_isready" and "--host=127.0.0.1" in probe
