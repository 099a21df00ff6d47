"""mkdocs hook: the policy configuration reference, generated from the code at build time.

``on_files`` adds the page ``reference/configuration.md`` (it is not a file in ``docs/``): one
section per top-level key of a policy, a table per object (field, type, default, description),
rendered from ``gateway.config.schema.policy_schema()``, the JSON Schema that ``gateway schema``
prints and ``policies/schema.json`` holds. The page therefore cannot drift from the typed model
(``gateway/config/model.py``).

Where the schema has no description for a field (msgspec puts a struct's docstring on its
object, not its fields' comments), the field's ``#:`` comment in the struct's source is used;
where it has no default (fields with a ``default_factory``), the default is read from the
struct's field itself. Both come from the same code the schema does: the structs of
``gateway.config`` (``model.py`` and the modules it assembles the policy from).

``render_reference()`` returns the page's Markdown; ``tests/test_docs.py`` calls it directly.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
import sys
from typing import Any

import msgspec
import yaml

PAGE = "reference/configuration.md"

__all__ = ["PAGE", "on_files", "render_reference"]

Node = dict[str, Any]


# ---- the code's own words: field comments and defaults ------------------------------------


def _field_comments(module: Any) -> dict[tuple[str, str], str]:
    """``(struct name, python field name) -> text`` of the ``#:`` lines right above each field."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    comments: dict[tuple[str, str], str] = {}
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            text: list[str] = []
            row = stmt.lineno - 2  # the line above, 0-based
            while row >= 0 and lines[row].strip().startswith("#:"):
                text.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            if text:
                comments[(cls.name, stmt.target.id)] = " ".join(text)
    return comments


def _policy_structs() -> dict[str, type[msgspec.Struct]]:
    """Every struct of ``gateway.config`` and its modules, by class name (the ``$defs`` names)."""
    import gateway.config as package

    modules = [package] + [importlib.import_module(f"{package.__name__}.{info.name}")
                           for info in pkgutil.iter_modules(package.__path__)]
    found: dict[str, type[msgspec.Struct]] = {}
    for module in modules:
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, msgspec.Struct)
                    and obj.__module__.startswith(package.__name__)):
                found.setdefault(obj.__name__, obj)
    return found


class _Code:
    """The structs behind the schema's ``$defs``: field comments, encode names, defaults."""

    def __init__(self) -> None:
        self.structs = _policy_structs()
        self._comments: dict[str, dict[tuple[str, str], str]] = {}

    def _fields(self, def_name: str) -> dict[str, Any]:
        cls = self.structs.get(def_name)
        if cls is None:
            return {}
        return {f.encode_name: f for f in msgspec.structs.fields(cls)}

    def _module_comments(self, module_name: str) -> dict[tuple[str, str], str]:
        if module_name not in self._comments:
            self._comments[module_name] = _field_comments(sys.modules[module_name])
        return self._comments[module_name]

    def comment(self, def_name: str, prop: str) -> str:
        """The ``#:`` comment of a field, in the class that declares it (or a base class)."""
        cls = self.structs.get(def_name)
        field = self._fields(def_name).get(prop)
        if cls is None or field is None:
            return ""
        for klass in cls.__mro__:
            if not klass.__module__.startswith("gateway."):
                continue  # msgspec.Struct, object
            text = self._module_comments(klass.__module__).get((klass.__name__, field.name))
            if text:
                return text
        return ""

    def default(self, def_name: str, prop: str) -> tuple[bool, Any]:
        """``(known, value)`` of a field's default as the struct declares it."""
        field = self._fields(def_name).get(prop)
        if field is None:
            return False, None
        if field.default is not msgspec.NODEFAULT:
            return True, msgspec.to_builtins(field.default)
        if field.default_factory is not msgspec.NODEFAULT:
            return True, msgspec.to_builtins(field.default_factory())
        return False, None


# ---- Markdown helpers ---------------------------------------------------------------------


def _rst_to_md(text: str) -> str:
    """The docstrings' reST bits (``code``, :mod:`x`) as Markdown."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    """Text safe in a table cell: one line, pipes outside code spans escaped."""
    text = " ".join(_rst_to_md(text).split())
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def _code(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _slug(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _paragraphs(doc: str) -> str:
    """A struct docstring as Markdown paragraphs."""
    blocks = [" ".join(b.split()) for b in re.split(r"\n\s*\n", doc.strip())]
    return "\n\n".join(_rst_to_md(b) for b in blocks if b)


# ---- the schema, walked -------------------------------------------------------------------


class _Reference:
    def __init__(self, schema: Node) -> None:
        self.defs: dict[str, Node] = schema["$defs"]
        self.root = self._ref_name(schema) or "Policy"
        self.code = _Code()
        # each object's home: the section its table is rendered in (path, anchor)
        self.home: dict[str, tuple[str, str]] = {}
        self.anchors: set[str] = set()
        self.order: list[tuple[str, str]] = []  # (def, path) in rendering order

    @staticmethod
    def _ref_name(node: Node) -> str | None:
        ref = node.get("$ref")
        return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None

    def _children(self, node: Node, path: str) -> list[tuple[str, str]]:
        """The objects a property's type reaches, each with the path it is reached at."""
        name = self._ref_name(node)
        if name is not None:
            return [(name, path)]
        found: list[tuple[str, str]] = []
        for option in node.get("anyOf", []):
            found += self._children(option, path)
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            found += self._children(node["items"], path + "[]")
        extra = node.get("additionalProperties")
        if node.get("type") == "object" and isinstance(extra, dict):
            found += self._children(extra, path + ".<name>")
        return found

    def _anchor(self, path: str) -> str:
        base = anchor = _slug(path) or "section"
        n = 2
        while anchor in self.anchors:
            anchor, n = f"{base}-{n}", n + 1
        self.anchors.add(anchor)
        return anchor

    def plan(self) -> list[str]:
        """Decide every object's section; top-level keys first, then depth-first below them."""
        top = list(self.defs[self.root]["properties"].items())
        self.anchors.add("top-level-keys")
        for key, node in top:
            anchor = self._anchor(key)
            for name, _ in self._children(node, key):
                self.home.setdefault(name, (key, anchor))

        def visit(def_name: str, path: str) -> None:
            self.order.append((def_name, path))
            for prop, node in self.defs[def_name].get("properties", {}).items():
                for child, child_path in self._children(node, f"{path}.{prop}"):
                    if child not in self.home:
                        self.home[child] = (child_path, self._anchor(child_path))
                        visit(child, child_path)

        for key, node in top:
            for name, path in self._children(node, key):
                if self.home[name][0] == key and name not in {d for d, _ in self.order}:
                    visit(name, path)
        return [key for key, _ in top]

    # ---- cells ----

    def type_of(self, node: Node) -> str:
        name = self._ref_name(node)
        if name is not None:
            anchor = self.home[name][1]
            return f"[{name}](#{anchor})"
        if "anyOf" in node:
            return " or ".join(self.type_of(o) for o in node["anyOf"])
        if "enum" in node:
            return "one of " + ", ".join(_code(v) for v in node["enum"])
        kind = node.get("type")
        if kind == "array":
            text = "list of " + self.type_of(node.get("items", {}))
        elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
            text = "map of name to " + self.type_of(node["additionalProperties"])
        else:
            text = str(kind) if kind else "any"
        limits = self._limits(node)
        return f"{text} ({limits})" if limits else text

    @staticmethod
    def _limits(node: Node) -> str:
        out = []
        for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"),
                          ("maximum", "<="), ("exclusiveMaximum", "<")):
            if key in node:
                out.append(f"{sign} {node[key]}")
        if "minLength" in node or "maxLength" in node:
            out.append(f"length {node.get('minLength', 0)}..{node.get('maxLength', '')}")
        if "minItems" in node:
            n = node["minItems"]
            out.append(f"at least {n} item{'' if n == 1 else 's'}")
        if "pattern" in node:
            out.append(f"matching `{node['pattern']}`")
        return ", ".join(out)

    def default_of(self, def_name: str, prop: str, node: Node, required: bool) -> str:
        if required:
            return "required"
        if "default" in node:
            value: Any = node["default"]
        else:
            known, value = self.code.default(def_name, prop)
            if not known:
                return ""
        if isinstance(value, dict) and value and self._children(node, prop):
            return "its fields' defaults"
        if isinstance(value, list) and value and any(isinstance(v, dict) for v in value):
            return "see below"
        return _code(value)

    def description_of(self, def_name: str, prop: str, node: Node) -> str:
        text = node.get("description") or self.code.comment(def_name, prop)
        return _cell(text) if text else ""

    # ---- sections ----

    def table(self, def_name: str) -> list[str]:
        node = self.defs[def_name]
        required = set(node.get("required", []))
        rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
        for prop, sub in node.get("properties", {}).items():
            rows.append(
                f"| `{prop}` | {self.type_of(sub)} "
                f"| {self.default_of(def_name, prop, sub, prop in required)} "
                f"| {self.description_of(def_name, prop, sub)} |"
            )
        return rows

    def list_defaults(self, def_name: str) -> list[str]:
        """Defaults that are lists of objects, spelt out as YAML below the table."""
        out: list[str] = []
        for prop, sub in self.defs[def_name].get("properties", {}).items():
            value = sub.get("default")
            if value is None:
                _, value = self.code.default(def_name, prop)
            if isinstance(value, list) and any(isinstance(v, dict) for v in value):
                dumped = yaml.safe_dump({prop: value}, sort_keys=False).rstrip()
                out += ["", f"Default of `{prop}`:", "", "```yaml", dumped, "```"]
        return out

    def object_section(self, def_name: str, path: str, level: int, anchor: str) -> list[str]:
        node = self.defs[def_name]
        out = ["", f"{'#' * level} `{path}` {{ #{anchor} }}", ""]
        out.append(f"Type `{def_name}`.")
        if node.get("description"):
            out += ["", _paragraphs(node["description"])]
        out += ["", *self.table(def_name), *self.list_defaults(def_name)]
        return out

    def render(self) -> str:
        keys = self.plan()
        policy = self.defs[self.root]
        top = policy["properties"]
        out = [
            "# Configuration reference",
            "",
            "!!! note \"Generated\"",
            "    This page is generated at build time from the policy's JSON Schema,",
            "    `gateway.config.schema.policy_schema()` (what `gateway schema` prints and",
            "    `policies/schema.json` holds), by `docs/hooks/config_reference.py`: it always",
            "    matches the code. Descriptions are the schema's, else the field's `#:`",
            "    comment in `gateway/config/model.py`. For the meaning of the keys in prose,",
            "    with examples, see [Configuration](../configuration.md).",
            "",
            _paragraphs(policy.get("description", "")),
            "",
            "## Top-level keys { #top-level-keys }",
            "",
            "| key | type | default | description |",
            "| --- | --- | --- | --- |",
        ]
        required = set(policy.get("required", []))
        for key in keys:
            node = top[key]
            children = self._children(node, key)
            summary = ""
            if children and self.defs[children[0][0]].get("description"):
                summary = _rst_to_md(self.defs[children[0][0]]["description"]).split("\n\n")[0]
            summary = summary or self.description_of(self.root, key, node)
            out.append(
                f"| [`{key}`](#{_slug(key)}) | {self.type_of(node)} "
                f"| {self.default_of(self.root, key, node, key in required)} | {_cell(summary)} |"
            )
        sections: dict[str, list[tuple[str, str]]] = {}
        for def_name, path in self.order:
            top_key = re.split(r"[.\[]", path, maxsplit=1)[0]
            sections.setdefault(top_key, []).append((def_name, path))
        for key in keys:
            node = top[key]
            owned = sections.get(key, [])
            if owned and self.home[owned[0][0]][0] == key:
                out += self.object_section(owned[0][0], key, 2, _slug(key))
                known, value = self.code.default(self.root, key)
                if known and isinstance(value, list) and value:
                    dumped = yaml.safe_dump({key: value}, sort_keys=False).rstrip()
                    out += ["", f"Default of `{key}`:", "", "```yaml", dumped, "```"]
                owned = owned[1:]
            else:
                out += ["", f"## `{key}` {{ #{_slug(key)} }}", "",
                        "| type | default | description |", "| --- | --- | --- |",
                        f"| {self.type_of(node)} "
                        f"| {self.default_of(self.root, key, node, key in required)} "
                        f"| {self.description_of(self.root, key, node)} |"]
                for name, _ in self._children(node, key):
                    hpath, anchor = self.home[name]
                    if hpath != key:
                        out += ["", f"`{name}` is described under [`{hpath}`](#{anchor})."]
            for def_name, path in owned:
                out += self.object_section(def_name, path, 3, self.home[def_name][1])
        return "\n".join(out) + "\n"


def render_reference(schema: Node | None = None) -> str:
    """The reference page's Markdown, from ``schema`` (default: the policy schema of the code)."""
    if schema is None:
        from gateway.config.schema import policy_schema

        schema = policy_schema()
    return _Reference(schema).render()


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render_reference()))
    return files
