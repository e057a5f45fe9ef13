"""The package's shape: no import cycle among its modules (Python or C) and no module over the
size bound. Each failure prints the offenders."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cudaforge"
CSRC = ROOT / "csrc"
MAX_LINES = 750  # "about 700"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(importer: str, is_package: bool, level: int, target: str | None) -> str:
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def python_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports, at any depth (function-level imports count)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (
                    resolve(name, is_package, node.level, node.module)
                    if node.level
                    else (node.module or "")
                )
                # `from pkg import sub` names a submodule where one exists
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for target in targets:
                if not target.startswith("cudaforge"):
                    continue
                found = known(target)
                # a package's __init__ re-exporting its own modules is not a cycle edge
                if found and found != name and not (is_package and found.startswith(name + ".")):
                    graph[name].add(found)
    # importing a submodule runs its packages' __init__ first; those are not edges of their own
    return graph


def c_calls() -> dict[str, set[str]]:
    """C file -> the other C files whose non-static functions it calls."""
    sources = sorted(CSRC.glob("*.c"))
    defined: dict[str, str] = {}
    texts = {}
    for path in sources:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.DOTALL)
        texts[path.name] = text
        for m in re.finditer(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{]*\)\s*\{",
                             text, flags=re.MULTILINE):
            defined[m.group(1)] = path.name
    graph: dict[str, set[str]] = {name: set() for name in texts}
    for name, text in texts.items():
        for ident in set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text)):
            owner = defined.get(ident)
            if owner and owner != name:
                graph[name].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_python_import_cycle():
    found = cycles(python_imports())
    assert not found, "import cycles among cudaforge's modules:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_c_call_cycle():
    found = cycles(c_calls())
    assert not found, "call cycles among csrc/ files:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_over_the_size_bound():
    files = list(PACKAGE.rglob("*.py")) + list(CSRC.glob("*.[ch]"))
    over = sorted(
        (n, str(p.relative_to(ROOT)))
        for p in files
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    )
    assert not over, f"modules over {MAX_LINES} lines:\n" + "\n".join(
        f"{n:6d} {p}" for n, p in reversed(over)
    )
