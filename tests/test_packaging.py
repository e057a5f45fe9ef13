"""pyproject.toml: the package list names every folder of cudaforge/, the package data covers
every file that is not Python, the dependencies are what the package imports, and the Python
floor is what the C core needs."""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cudaforge"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = CONFIG["tool"]["setuptools"]
BUILT = {".py", ".pyc", ".so"}


def folders_with_files() -> dict[str, Path]:
    """Package name -> folder, for cudaforge/ and every folder under it that holds a file."""
    folders = {"cudaforge": PACKAGE}
    for path in PACKAGE.rglob("*"):
        if (
            path.is_file()
            and "__pycache__" not in path.parts
            and path.suffix not in {".pyc", ".so"}
        ):
            folders[".".join(path.parent.relative_to(ROOT).parts)] = path.parent
    return folders


def test_every_folder_is_a_declared_package():
    missing = set(folders_with_files()) - set(SETUPTOOLS["packages"])
    assert not missing, f"add to [tool.setuptools] packages: {sorted(missing)}"


def test_package_data_covers_every_data_file():
    data = SETUPTOOLS["package-data"]
    places = {**folders_with_files(), **{k: ROOT / v for k, v in SETUPTOOLS["package-dir"].items()}}
    unshipped = [
        str(path.relative_to(ROOT))
        for package, folder in places.items()
        for path in folder.iterdir()
        if path.is_file()
        and path.suffix not in BUILT
        and not any(fnmatch.fnmatch(path.name, p) for p in data.get(package, []))
    ]
    assert not unshipped, f"not in [tool.setuptools.package-data]: {unshipped}"


def third_party_imports() -> tuple[set[str], set[str]]:
    """Top-level modules, not the standard library's or cudaforge, that the package imports:
    (needed, tried), tried being those imported only inside a try that handles ImportError."""
    needed, tried = set(), set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        guarded = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            catches = {
                name.id
                for handler in node.handlers
                if handler.type is not None
                for name in ast.walk(handler.type)
                if isinstance(name, ast.Name)
            }
            if catches & {"ImportError", "ModuleNotFoundError"}:
                guarded |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = {node.module.split(".")[0]}
            else:
                continue
            (tried if id(node) in guarded else needed).update(modules)
    outside = set(sys.stdlib_module_names) | {"cudaforge"}
    return needed - outside, tried - outside - needed


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0] for r in requirements}


def test_dependencies_are_what_the_package_imports():
    required = names(CONFIG["project"]["dependencies"])
    optional = set().union(*(names(r) for r in CONFIG["project"]["optional-dependencies"].values()))
    needed, tried = third_party_imports()
    assert needed <= required | optional, f"imported, not declared: {needed - required}"
    assert required <= needed, f"declared, never imported: {required - needed}"
    assert tried <= needed | optional | {"tqdm"}, f"unknown optional imports: {tried}"


def test_the_python_floor_is_what_the_c_core_needs():
    floor = tuple(int(x) for x in re.findall(r"\d+", CONFIG["project"]["requires-python"]))
    core = "".join(p.read_text() for p in (ROOT / "csrc").glob("*.[ch]"))
    if "PyType_GetModuleByDef" in core:
        assert floor >= (3, 11)
    assert f"Python {floor[0]}.{floor[1]}+" in (ROOT / "README.md").read_text()
