"""KernelBench-format problems: a PyTorch `Model`, `get_inputs()` and `get_init_inputs()` in a source
string, loaded from a string, a file or the dev set, with its size constants overridable.

Size constants are the module-level assignments whose value, after the module runs, is an int, a
float, or a flat list/tuple of them (`batch_size = 16`, `N = 2048 * 2`, `kernel_size = (3, 5)`).
An override is written into the source as an extra line right after the original assignment, so
constants derived from it further down (`shape = (batch_size, dim)`) follow, and the source that
runs is the source that an agent or a report shows. Assignments inside functions, classes or `if`
blocks are not constants.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import linecache
import os
import random
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEV_SET_ENV = "CUDAFORGE_KERNELBENCH"


def problem_hash(problem_source: str) -> str:
    """The one hash of a problem: sha256 of its source with line endings and trailing blanks
    normalized, so that the same problem saved on another system, or by an editor that trims
    lines, keeps its key in the kernel store and its identity in results."""
    lines = [line.rstrip() for line in problem_source.replace("\r\n", "\n").split("\n")]
    return hashlib.sha256("\n".join(lines).strip().encode()).hexdigest()


@dataclass
class Problem:
    """One problem. `source` is what runs (overrides applied); `base_source` is as it was given."""

    name: str
    source: str
    level: int | None = None
    problem_id: int | None = None
    sizes: dict[str, Any] = field(default_factory=dict)  # the overrides applied to base_source
    base_source: str = ""
    origin: str = ""  # file path, "dev:L/ID" or "string"

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_source(
        cls,
        source: str,
        *,
        name: str | None = None,
        sizes: dict[str, Any] | None = None,
        level: int | None = None,
        problem_id: int | None = None,
        origin: str = "string",
    ) -> Problem:
        """A problem from its source text; `sizes` overrides module-level constants by name."""
        if not isinstance(source, str):
            raise TypeError(f"a problem's source must be a str, not {type(source).__name__}")
        tree = _parse(source, name or "problem")
        defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in defined]
        if missing:
            raise ValueError(
                f"problem {name or ''!s} does not define {', '.join(missing)}: a KernelBench problem "
                "defines class Model, get_inputs() and get_init_inputs() at module level"
            )
        sizes = dict(sizes or {})
        effective = _apply_sizes(source, tree, sizes, name or "problem") if sizes else source
        if name is None:
            name = "problem_" + problem_hash(source)[:8]
        return cls(
            name=name,
            source=effective,
            level=level,
            problem_id=problem_id,
            sizes=sizes,
            base_source=source,
            origin=origin,
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, sizes: dict[str, Any] | None = None) -> Problem:
        path = Path(path)
        return cls.from_source(path.read_text(), name=path.stem, sizes=sizes, origin=str(path))

    @classmethod
    def from_dev_set(
        cls,
        level: int,
        problem_id: int,
        *,
        sizes: dict[str, Any] | None = None,
        path: str | os.PathLike | None = None,
    ) -> Problem:
        """A problem of the KernelBench dev set by level and id (see `dev_set_path`)."""
        rows = _dev_rows(str(dev_set_path(path)))
        row = rows.get((int(level), int(problem_id)))
        if row is None:
            ids = sorted(pid for (lvl, pid) in rows if lvl == int(level))
            raise KeyError(
                f"no dev problem level {level} id {problem_id}; level {level} has ids "
                f"{_ranges(ids) or 'none'}"
            )
        return cls.from_source(
            row["code"],
            name=row["name"],
            sizes=sizes,
            level=row["level"],
            problem_id=row["problem_id"],
            origin=f"dev:{row['level']}/{row['problem_id']}",
        )

    @staticmethod
    def list_dev_set(
        level: int | None = None, *, path: str | os.PathLike | None = None
    ) -> list[Problem]:
        """Every dev problem (of one level, if given), ordered by level and id."""
        rows = _dev_rows(str(dev_set_path(path)))
        return [
            Problem.from_dev_set(lvl, pid, path=path)
            for (lvl, pid) in sorted(rows)
            if level is None or lvl == level
        ]

    def with_sizes(self, **sizes: Any) -> Problem:
        """The same problem with more overrides (merged over the ones it has)."""
        merged = {**self.sizes, **sizes}
        return Problem.from_source(
            self.base_source or self.source,
            name=self.name,
            sizes=merged,
            level=self.level,
            problem_id=self.problem_id,
            origin=self.origin,
        )

    # ------------------------------------------------------------------ facts

    @property
    def hash(self) -> str:
        """problem_hash() of the source that runs (overrides included)."""
        return problem_hash(self.source)

    def constants(self) -> dict[str, Any]:
        """The overridable constants and their values in the source that runs."""
        return dict(_constants(self.source, self.name))

    def size_constants(self) -> dict[str, int]:
        """The int constants (batch_size, dim, ...) and their values."""
        return {k: v for k, v in self.constants().items() if type(v) is int}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "level": self.level,
            "problem_id": self.problem_id,
            "sizes": dict(self.sizes),
            "base_source": self.base_source or self.source,
            "origin": self.origin,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Problem:
        return cls.from_source(
            data["base_source"],
            name=data.get("name"),
            sizes=data.get("sizes") or None,
            level=data.get("level"),
            problem_id=data.get("problem_id"),
            origin=data.get("origin", "string"),
        )

    # ------------------------------------------------------------------ running it

    def build_module(self) -> types.ModuleType:
        """Execute the source in a fresh module namespace (nothing shared between calls)."""
        name = f"cudaforge_problem_{self.hash[:12]}"
        filename = f"<problem {self.name}>"
        code = _compiled(self.source, filename)
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        module = types.ModuleType(name, f"KernelBench problem {self.name}")
        module.__file__ = filename
        exec(code, module.__dict__)  # noqa: S102 - running the problem is the point
        return module

    def init_inputs(self, seed: int = 0, device: str = "cpu", module=None) -> list:
        import torch

        module = module or self.build_module()
        with _seeded(seed), torch.device(device):
            return list(module.get_init_inputs())

    def make_model(self, device: str = "cpu", seed: int = 0, module=None):
        """The reference Model on `device`, its weights drawn from `seed`."""
        import torch

        module = module or self.build_module()
        init = self.init_inputs(seed, device, module)
        with _seeded(seed), torch.device(device):
            model = module.Model(*init)
        return model.to(device) if hasattr(model, "to") else model

    def make_inputs(self, seed: int = 0, device: str = "cpu", module=None) -> list:
        """`get_inputs()` drawn from `seed`, created on `device` (tensors moved there if not)."""
        import torch

        module = module or self.build_module()
        with _seeded(seed), torch.device(device):
            inputs = list(module.get_inputs())
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]

    def footprint(self, forward: bool = True) -> dict[str, int | None]:
        """Bytes of inputs, parameters (+buffers) and outputs, measured on the meta device (no
        memory used). `output_bytes` is None when not measured: `forward=False`, a model whose
        forward cannot run on meta tensors, or a recurrent model (their meta forward is slow)."""
        return _meta_footprint(self.source, self.name, forward)

    def shrink(self, max_bytes: int = 32 << 20, *, min_size: int = 16) -> Problem:
        """A copy whose int constants (those >= `min_size`, so kernel sizes, strides and dims stay)
        are halved, the largest first, until inputs + parameters + outputs fit in `max_bytes`. Each
        step is checked by building the model and running its forward on the meta device; a step
        that breaks it is undone and that constant is left alone. For CPU runs and tests; the
        result may stay above `max_bytes` when the rest is not in size constants."""
        base = self.base_source or self.source
        overrides = dict(self.sizes)
        current = self
        try:
            use_forward = True
            measured = _total(current.footprint(forward=True))
        except Exception:  # noqa: BLE001 - any failure of a meta forward means "do not use it"
            use_forward = False  # the forward cannot run on meta tensors as given
            measured = _total(current.footprint(forward=False))
        if measured is None or measured <= max_bytes:
            return current
        literal = _literal_names(base)
        frozen: set[str] = set()
        for _ in range(96):
            values = current.constants()
            knobs = {
                k: _largest(v)
                for k, v in values.items()
                if k not in frozen and k in literal and _shrinkable(v, min_size)
            }
            if not knobs:
                break
            knob = max(knobs, key=lambda k: (knobs[k], k))
            trial = {**overrides, knob: _halve(values[knob])}
            try:
                candidate = Problem.from_source(
                    base,
                    name=self.name,
                    sizes=trial,
                    level=self.level,
                    problem_id=self.problem_id,
                    origin=self.origin,
                )
                size = _total(candidate.footprint(forward=use_forward))
            except Exception:  # noqa: BLE001 - a step that breaks the problem is undone
                size = None
            if size is None:
                frozen.add(knob)
                continue
            overrides, current, measured = trial, candidate, size
            if measured <= max_bytes:
                break
        return current


# ---------------------------------------------------------------------- dev set


def dev_set_path(path: str | os.PathLike | None = None) -> Path:
    """Where the dev set is: `path`, else $CUDAFORGE_KERNELBENCH (the .jsonl file or its folder),
    else the copy shipped in the package (cudaforge/data/kernelbench, MIT licensed)."""
    if path is None:
        path = os.environ.get(DEV_SET_ENV)
    if path is None:
        path = Path(__file__).resolve().parents[1] / "data" / "kernelbench" / "dev_problems.jsonl"
    path = Path(path)
    if path.is_dir():
        path = path / "dev_problems.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"KernelBench dev set not found at {path}; set {DEV_SET_ENV} to the dev_problems.jsonl "
            "file (or its folder)"
        )
    return path


@functools.lru_cache(maxsize=4)
def _dev_rows_cached(path: str, mtime: float) -> dict[tuple[int, int], dict]:
    rows = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows[(int(row["level"]), int(row["problem_id"]))] = row
            except (ValueError, KeyError) as e:
                raise ValueError(f"{path}:{number}: not a dev problem row ({e})") from None
    return rows


def _dev_rows(path: str) -> dict[tuple[int, int], dict]:
    return _dev_rows_cached(path, os.path.getmtime(path))


def _ranges(ids: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(ids):
        if start is None:
            start = v
        if i + 1 == len(ids) or ids[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


# ---------------------------------------------------------------------- constants and overrides


def _parse(source: str, name: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"problem {name}: syntax error at line {e.lineno}: {e.msg}") from None


def _assigned_names(node: ast.stmt) -> list[str]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = [node.target]
    names: list[str] = []
    while targets:
        t = targets.pop(0)
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            targets.extend(t.elts)
    return names


def _is_constant_value(value: Any) -> bool:
    if type(value) in (int, float):
        return True
    if type(value) in (list, tuple):
        return len(value) > 0 and all(type(v) in (int, float) for v in value)
    return False


@functools.lru_cache(maxsize=512)
def _constants(source: str, name: str) -> tuple[tuple[str, Any], ...]:
    """Run the module once (module level only: no model, no inputs) and keep the constants."""
    tree = _parse(source, name)
    names: list[str] = []
    for node in tree.body:
        for n in _assigned_names(node):
            if n not in names:
                names.append(n)
    namespace: dict[str, Any] = {"__name__": "cudaforge_problem_constants"}
    exec(_compiled(source, f"<problem {name}>"), namespace)  # noqa: S102 - module level only
    return tuple((n, namespace[n]) for n in names if _is_constant_value(namespace.get(n)))


def _apply_sizes(source: str, tree: ast.Module, sizes: dict[str, Any], name: str) -> str:
    known = dict(_constants(source, name))
    for key, value in sizes.items():
        if key not in known:
            raise ValueError(
                f"problem {name}: {key!r} is not a size constant; overridable: "
                f"{', '.join(known) or 'none'}"
            )
        if not _is_constant_value(value):
            raise TypeError(
                f"problem {name}: override {key}={value!r} must be an int, a float or a list/tuple "
                "of them"
            )
        if type(known[key]) is int and type(value) is not int:
            raise TypeError(f"problem {name}: {key} is an int constant; got {value!r}")
    lines = source.splitlines(True)
    inserts: dict[int, list[str]] = {}
    for node in tree.body:
        hit = [n for n in _assigned_names(node) if n in sizes]
        for n in hit:
            inserts.setdefault(node.end_lineno, []).append(
                f"{n} = {sizes[n]!r}  # cudaforge: size override\n"
            )
    out: list[str] = []
    for number, line in enumerate(lines, 1):
        out.append(line)
        if number in inserts:
            if not line.endswith("\n"):
                out[-1] = line + "\n"
            out.extend(inserts[number])
    return "".join(out)


@functools.lru_cache(maxsize=512)
def _compiled(source: str, filename: str):
    return compile(source, filename, "exec")


@functools.lru_cache(maxsize=256)
def _literal_names_cached(source: str) -> frozenset[str]:
    """Names whose assigned value is a literal (a number, or a list/tuple of numbers), or an
    arithmetic expression of literals: those are safe to halve; derived ones follow by themselves."""
    out = set()
    for node in ast.parse(source).body:
        value = getattr(node, "value", None)
        if value is not None and _is_literal(value):
            out.update(_assigned_names(node))
    return frozenset(out)


def _literal_names(source: str) -> frozenset[str]:
    return _literal_names_cached(source)


def _is_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, float)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_is_literal(e) for e in node.elts)
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left) and _is_literal(node.right)
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    return False


def _largest(value: Any) -> float:
    return max(value) if isinstance(value, (list, tuple)) else value


def _shrinkable(value: Any, min_size: int) -> bool:
    if type(value) is int:
        return value >= min_size
    if type(value) in (list, tuple):
        return all(type(v) is int for v in value) and max(value) >= min_size
    return False


def _halve(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(max(1, v // 2) if v >= 2 else v for v in value)
    return max(1, value // 2)


def _total(fp: dict[str, int | None] | None) -> int | None:
    if fp is None:
        return None
    return sum(v for v in fp.values() if v is not None)


# ---------------------------------------------------------------------- meta footprint


@functools.lru_cache(maxsize=1024)
def _meta_footprint_cached(source: str, name: str, forward: bool) -> tuple | None:
    import torch

    problem = Problem(name=name, source=source)
    module = problem.build_module()
    try:
        with torch.device("meta"), _seeded(0):
            init = list(module.get_init_inputs())
            model = module.Model(*init)
            inputs = list(module.get_inputs())
    except Exception:  # noqa: BLE001 - not buildable on meta: size unknown
        return None
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    input_bytes = sum(_nbytes(t) for t in tensors)
    param_bytes = 0
    if isinstance(model, torch.nn.Module):
        param_bytes = sum(_nbytes(p) for p in model.parameters())
        param_bytes += sum(_nbytes(b) for b in model.buffers())
    output_bytes = None
    recurrent = isinstance(model, torch.nn.Module) and any(
        isinstance(m, torch.nn.RNNBase) for m in model.modules()
    )
    if forward and not recurrent:
        try:
            with torch.no_grad():
                out = model(*inputs)
        except Exception as e:
            # a forward that fails on meta tensors for shape reasons means the sizes are wrong;
            # one that fails because an op has no meta kernel says nothing about the sizes
            if _is_shape_error(e):
                raise
            out = None
        if out is not None:
            output_bytes = sum(_nbytes(t) for t in _flatten(out) if isinstance(t, torch.Tensor))
    return (input_bytes, param_bytes, output_bytes)


def _meta_footprint(source: str, name: str, forward: bool) -> dict[str, int | None] | None:
    got = _meta_footprint_cached(source, name, forward)
    if got is None:
        return None
    return {"input_bytes": got[0], "param_bytes": got[1], "output_bytes": got[2]}


def _is_shape_error(e: BaseException) -> bool:
    text = str(e)
    if "meta" in text.lower() and ("not implemented" in text.lower() or "item()" in text):
        return False
    return isinstance(e, (RuntimeError, ValueError, IndexError, TypeError))


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _flatten(out) -> list:
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in _flatten(x)]
    if isinstance(out, dict):
        return [y for x in out.values() for y in _flatten(x)]
    return [out]


@contextlib.contextmanager
def _seeded(seed: int):
    """Seed Python's and torch's generators (CPU and every CUDA device), as torch.manual_seed
    does for them. Not torch.manual_seed itself: it also seeds the XPU and MTIA generators,
    whose lazy seeding formats a Python stack each time (0.7 ms per call on the H200's host, and
    an evaluation draws fresh inputs before every timed run)."""
    import torch

    random.seed(seed)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        for generator in torch.cuda.default_generators:
            generator.manual_seed(seed)
    elif torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # queued for the CUDA initialization
    yield


__all__ = ["Problem", "dev_set_path"]
