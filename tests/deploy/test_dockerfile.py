"""deploy/Dockerfile: hadolint when it is installed, and its key properties always."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy._util import DEPLOY, REPO, require_tool

DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return result


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            out.append([])
        assert out, "an instruction before the first FROM"
        out[-1].append(ins)
    return out


def only(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in stage if kw == keyword]


@pytest.mark.process
def test_hadolint_passes() -> None:
    hadolint = require_tool("hadolint")
    out = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_multi_stage_builder_makes_wheels_runtime_is_slim() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    froms = [stage[0][1] for stage in all_stages]
    assert re.search(r"\bAS builder$", froms[0], re.IGNORECASE)
    builder_runs = " ".join(only(all_stages[0], "RUN"))
    assert "pip wheel" in builder_runs and "requirements.lock" in builder_runs
    runtime_image = froms[-1].split()[0]
    assert re.fullmatch(r"python:3\.1[12](\.\d+)?-slim(-\w+)?", runtime_image), runtime_image


@pytest.mark.parametrize("line", [s[0][1] for s in stages()])
def test_base_images_pinned_by_tag(line: str) -> None:
    image = line.split()[0]
    _, _, tag = image.partition(":")
    assert tag and tag != "latest" and re.search(r"\d", tag), f"unpinned base image {image}"
    # python:3.11.13-slim-...: a full patch version, not a floating 3.11-slim
    assert re.match(r"3\.\d+\.\d+", tag), f"{image}: pin the patch version"


def test_runtime_installs_only_locked_wheels_offline() -> None:
    runtime = stages()[-1]
    runs = " ".join(only(runtime, "RUN"))
    assert "--no-index" in runs and "requirements.lock" in runs
    assert "pip check" in runs
    assert not re.search(r"\bapt-get install\b.*\b(gcc|build-essential)\b", runs)


def test_runs_as_non_root_numeric_user() -> None:
    users = only(stages()[-1], "USER")
    assert users, "runtime stage has no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"USER {users[-1]} must be a numeric non-root uid"


def test_healthcheck_is_python_on_healthz() -> None:
    runtime = stages()[-1]
    checks = only(runtime, "HEALTHCHECK")
    assert len(checks) == 1
    check = checks[0]
    assert "CMD" in check and "python" in check and "curl" not in check and "wget" not in check
    envs = " ".join(only(runtime, "ENV"))
    url = re.search(r"HEALTHCHECK_URL=(\S+)", envs)
    assert url and url.group(1).endswith(":8080/healthz")
    assert "HEALTHCHECK_URL" in check


def test_entrypoint_cmd_stopsignal_volume() -> None:
    runtime = stages()[-1]
    assert json.loads(only(runtime, "ENTRYPOINT")[-1]) == ["gateway", "serve"]
    assert json.loads(only(runtime, "CMD")[-1]) == [
        "--config",
        "/etc/gateway/policies",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
    ]
    assert only(runtime, "STOPSIGNAL") == ["SIGTERM"]
    assert any("/etc/gateway/policies" in v for v in only(runtime, "VOLUME"))
    assert "8080" in " ".join(only(runtime, "EXPOSE"))


def test_copied_sources_exist_and_are_not_ignored() -> None:
    ignore = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", "the .dockerignore is an allow-list"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for stage in stages():
        for args in only(stage, "COPY"):
            if args.startswith("--from"):
                continue
            *sources, _dest = args.split()
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
                assert src.rstrip("/") in allowed, f"COPY {src}: excluded by {DOCKERIGNORE.name}"
