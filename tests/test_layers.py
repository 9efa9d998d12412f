"""The package's layers, as README's "Code layout" lists them: imports point down only
(inside functions too), no circle, few function-local imports, and every path named there
exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pfedwn_jax"
MAX_LOCAL = 15  # function-local imports of the package's own modules, each with its reason


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Code layout (read this first)", 1)[1].split("\n## ", 1)[0]


def _layers() -> dict[str, int]:
    """Module prefix (`pfedwn_jax.runner`) -> layer number, from the numbered list."""
    out = {}
    for number, item in re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\n\n)", _layout(), re.M | re.S):
        for path in re.findall(r"`(pfedwn_jax/[\w/]*?)(?:\.py)?/?`", item):
            out.setdefault(path.replace("/", "."), int(number))
    return out


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """`(module imported, line, inside a function)` of every import of the package's own."""
    tree = ast.parse(path.read_text())
    inner = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(f)
    }
    typing_only = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, ast.If) and getattr(f.test, "id", None) == "TYPE_CHECKING"
        for n in ast.walk(f)
    }  # annotations only: not imported when the program runs
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            # `from pfedwn_jax.data import registry`: the submodule; `from x import name`: x
            names = [
                f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names
            ]
        else:
            continue
        out += [(n, node.lineno, id(node) in inner) for n in names if n.startswith("pfedwn_jax.")]
    return out


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _layer(module: str, layers: dict[str, int]) -> int | None:
    hits = [p for p in layers if module == p or module.startswith(p + ".")]
    return layers[max(hits, key=len)] if hits else None


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer_and_imports_point_down():
    layers = _layers()
    assert len(set(layers.values())) >= 8, layers
    up, unplaced = [], []
    for path in _files():
        mod = _module(path)
        if mod == "pfedwn_jax":  # the package face: lazy names, no eager import
            continue
        own = _layer(mod, layers)
        if own is None:
            unplaced.append(mod)
            continue
        for target, line, _ in _imports(path):
            theirs = _layer(target, layers)
            if theirs is not None and theirs < own:
                up.append(f"{mod}:{line} -> {target}")
    assert unplaced == [], "modules the README's layout does not place"
    assert up == [], "imports that run up the layers"


def test_no_import_circle():
    graph = {_module(p): {t for t, _, _ in _imports(p)} for p in _files()}
    modules = set(graph)
    graph = {m: {t if t in modules else t.rsplit(".", 1)[0] for t in ts} for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in modules or w == "pfedwn_jax":
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    assert circles == [], circles


def test_few_function_local_imports_each_with_its_reason():
    local = []
    for path in _files():
        lines = path.read_text().splitlines()
        for target, line, inner in _imports(path):
            if inner:
                local.append((f"{_module(path)}:{line} -> {target}", "#" in lines[line - 1]))
    assert len(local) <= MAX_LOCAL, local
    assert [name for name, reasoned in local if not reasoned] == []


def test_every_path_the_layout_names_exists():
    paths = set(re.findall(r"`((?:pfedwn_jax|tests|docs|scripts|benchmarks)/[\w./]*)`", _layout()))
    assert len(paths) > 20
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []
