"""The documentation site: it builds with --strict, the README stays a front door, the generated
configuration reference covers the policy schema, and a broken link does fail the build."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gateway.config.schema import policy_schema

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250


def _mkdocs_build(config_dir: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=config_dir, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _top_level_keys() -> list[str]:
    schema = policy_schema()
    defs = schema["$defs"]
    assert isinstance(defs, dict)
    root = str(schema["$ref"]).rsplit("/", 1)[-1]
    return list(defs[root]["properties"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    result = _mkdocs_build(ROOT, site_dir)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return site_dir


def test_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "benchmarks" / "noisy-neighbour" / "index.html").is_file()
    # the repository's own documents, published by docs/hooks/repo_files.py
    assert (site / "repo" / "loadtest" / "index.html").is_file()
    assert (site / "repo" / "loadtest" / "docs" / "rollout-timeline.png").is_file()


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_configuration_reference_covers_every_top_level_key(site: Path) -> None:
    keys = _top_level_keys()
    assert len(keys) > 10
    markdown = _hook().render_reference()
    headings = {line for line in markdown.splitlines() if line.startswith("## ")}
    for key in keys:
        assert any(h.startswith(f"## `{key}`") for h in headings), f"no section for {key}"
    # the descriptions come from the code too (the schema's, else the fields' #: comments):
    # most fields have one, so losing them (a struct moved where the hook does not look) shows
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    described = [row for row in rows if not row.rstrip().endswith("|  |")]
    assert len(described) >= len(rows) // 2, f"{len(described)} of {len(rows)} fields described"
    html = (site / "reference" / "configuration" / "index.html").read_text(encoding="utf-8")
    for key in keys:
        assert f'<h2 id="{key}">' in html, f"no heading for {key} in the built page"


def test_broken_link_anchor_or_orphan_page_fails_the_strict_build(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # what mkdocs.yml's hooks and watch list read outside docs/
    for name in ("gateway", "loadtest", "deploy"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    page = tmp_path / "docs" / "quickstart.md"
    page.write_text(page.read_text(encoding="utf-8")
                    + "\n[gone](no-such-page.md) and [nowhere](apis.md#no-such-anchor)\n",
                    encoding="utf-8")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in nav\n", encoding="utf-8")

    result = _mkdocs_build(tmp_path, tmp_path / "site")

    assert result.returncode != 0
    for culprit in ("no-such-page.md", "no-such-anchor", "orphan.md"):
        assert culprit in result.stderr, f"{culprit} not reported:\n{result.stderr}"
