"""mkdocs hook: documents that live beside their code, served under ``repo/`` in the site.

``loadtest/README.md``, the benchmark notes and ``deploy/README.md`` stay where they are (next
to the code they describe); ``on_files`` adds each, and the images they and the benchmark pages
show, as a file of the site at ``repo/<its path in the repository>``. Their relative links
between one another therefore keep working, and the docs link them as ``repo/...`` (checked by
``mkdocs build --strict`` like any page). Nothing is copied into ``docs/``.

Those files are written for GitHub's Markdown, where a list may follow a paragraph line
directly and an item's content is indented by 2; Python-Markdown wants a blank line before the
list and 4 spaces, so ``on_page_markdown`` lays their lists out that way (and changes nothing
else).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["REPO_FILES", "github_lists", "on_files", "on_page_markdown"]

_ITEM = re.compile(r"^(?:[-*+]|\d+[.)]) ")

#: repository paths published under ``repo/`` (pages, and the images they show)
REPO_FILES = (
    "loadtest/README.md",
    "loadtest/bench/LEDGER.md",
    "loadtest/bench/overhead/README.md",
    "deploy/README.md",
    "loadtest/docs/sweep-throughput.png",
    "loadtest/docs/rollout-timeline.png",
)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    root = Path(config.config_file_path).parent
    for rel in REPO_FILES:
        files.append(File.generated(config, f"repo/{rel}", abs_src_path=str(root / rel)))
    return files


def github_lists(markdown: str) -> str:
    """GitHub's list layout in Python-Markdown's terms.

    A top-level list may follow a paragraph line directly (a blank line is put in), an item's
    content is indented by 2 (by 4 here: the lines of an item indented by less than 4, fenced
    blocks included, get 2 more spaces), and an item may follow a multi-paragraph one directly
    (a blank line again).
    """
    out: list[str] = []
    in_list = False
    loose = False  # the current item holds a blank line: the next one needs one before it
    fence: str | None = None  # the padding added to the lines of the open fenced block
    for line in markdown.split("\n"):
        stripped = line.lstrip()
        if fence is not None:
            out.append(fence + line if line.strip() else line)
            if stripped.startswith(("```", "~~~")):
                fence = None
            continue
        pad = ""
        if _ITEM.match(line):
            prev = out[-1] if out else ""
            after_paragraph = not in_list and not prev.startswith((" ", "\t", "|", "#"))
            if prev.strip() and (after_paragraph or (in_list and loose)):
                out.append("")
            in_list, loose = True, False
        elif not line.strip():
            loose = in_list
        else:
            indent = len(line) - len(stripped)
            if indent == 0:
                in_list = False
            elif in_list and indent < 4:
                pad = "  "
        if stripped.startswith(("```", "~~~")):
            fence = pad
        out.append(pad + line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri.startswith("repo/"):
        return github_lists(markdown)
    return markdown
