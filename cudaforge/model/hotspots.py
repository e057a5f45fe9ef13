"""A model's hot spots, each turned into a standalone KernelBench-format problem.

1. `profile_model` (cudaforge.model.timing) runs a few forwards with a range per module: time
   per module and per op (GPU time on a GPU, CPU time on the CPU).
2. The modules that take a fair share of that time have their first call captured
   (cudaforge.model.capture), and candidates are formed from each: a leaf torch.nn module, the
   fusable chains of a module's own forward, or a whole block without weighted layers
   (cudaforge.model.sites; tracing in cudaforge.model.tracing, fusion in
   cudaforge.model.regions, the problem's source in cudaforge.model.codegen). A module whose
   forward cannot be traced keeps its leaf modules as candidates.
3. Each candidate's problem is checked to reproduce the module's output with the captured
   weights, timed on its captured inputs; identical problems (the same layer in every block)
   are merged, overlaps removed, and the largest are kept.

The captured weights are kept with the hot spot: `Hotspot.state_dict()` maps the problem's own
parameter names to them (`Model(*get_init_inputs()).load_state_dict(...)` reproduces the
module's output exactly; `find_hotspots` checks that), and `Hotspot.save(folder)` writes the
problem, the weights and the captured inputs to files.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import CudaforgeError
from ..harness.problem import problem_hash
from .attribution import attribute
from .capture import capture_calls
from .codegen import NotExtractable
from .regions import DROPOUT_MODULES, TRANSPARENT_MODULES, is_torch_leaf
from .sites import (
    Candidate,
    Site,
    block_site,
    chain_sites,
    check_problem,
    error_line,
    module_site,
)
from .timing import ModelProfile, model_device, profile_model, split_inputs, time_call

MIN_SHARE = 0.02  # a hot spot takes at least this share of the model's time
MAX_HOTSPOTS = 8


class HotspotError(CudaforgeError):
    """The model cannot be handled: the message names what and why. Attribute: skipped, the
    candidates that were refused, each with its reason."""

    def __init__(self, message: str, skipped: Sequence[Skipped] = ()):
        super().__init__(message)
        self.skipped = list(skipped)


@dataclass
class Hotspot:
    """A problem and the sites that share it (the same layer in every block)."""

    name: str
    kind: str
    label: str
    problem_source: str
    sites: list[Site]
    # of the model's forward time, all sites together, measured inside the forward (disjoint
    # from every other hot spot's: cudaforge.model.attribution)
    share: float = 0.0
    model_ms: float | None = None  # that time per forward (ms)

    @property
    def problem_hash(self) -> str:
        return problem_hash(self.problem_source)

    @property
    def ms(self) -> float:
        """Time of every call of every site per forward (ms)."""
        return sum((s.ms or 0.0) * s.calls for s in self.sites)

    @property
    def dtype(self) -> str:
        dtypes = sorted({str(s.dtype).replace("torch.", "") for s in self.sites[0].input_specs})
        return ",".join(dtypes) or "none"

    @property
    def shapes(self) -> list[list[int]]:
        return [list(s.shape) for s in self.sites[0].input_specs]

    def state_dict(self, site: int = 0) -> dict[str, torch.Tensor]:
        """The captured weights under the problem's parameter names."""
        chosen = self.sites[site]
        return {k: t.detach() for k, t in zip(chosen.problem_keys, chosen.tensors)}

    def inputs(self, site: int = 0) -> list[torch.Tensor]:
        """The captured inputs of one site, in the problem's order."""
        return list(self.sites[site].inputs)

    def save(self, folder: str | Path) -> Path:
        """Write problem.py, weights.pt (state_dict()) and inputs.pt (inputs()) to folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "problem.py").write_text(self.problem_source)
        torch.save({k: v.cpu() for k, v in self.state_dict().items()}, folder / "weights.pt")
        torch.save([t.cpu() for t in self.inputs()], folder / "inputs.pt")
        return folder

    def __repr__(self) -> str:
        return (
            f"Hotspot({self.name!r}, kind={self.kind!r}, sites={len(self.sites)}, "
            f"ms={self.ms:.4g}, share={self.share:.1%})"
        )


@dataclass
class Skipped:
    path: str
    what: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path or '(root)'} ({self.what}): {self.reason}"


# ---------------------------------------------------------------- the search


@dataclass
class HotspotSearch:
    """What find_hotspots found: hot spots (largest first), refused candidates with reasons,
    the profile, and the measured forward time (ms)."""

    hotspots: list[Hotspot]
    skipped: list[Skipped]
    profile: ModelProfile
    forward_ms: float
    notes: list[str] = field(default_factory=list)
    # the share of the forward the hot spots cover together (their shares' sum, at most 1);
    # None when it could not be measured inside the forward
    coverage: float | None = None

    def __iter__(self):
        return iter(self.hotspots)

    def __len__(self) -> int:
        return len(self.hotspots)

    def __getitem__(self, index):
        return self.hotspots[index]

    def summary(self) -> str:
        covered = f", covering {self.coverage:.1%} of it" if self.coverage is not None else ""
        lines = [
            (
                f"forward: {self.forward_ms:.4g} ms; {len(self.hotspots)} hot spot(s){covered} "
                "(shares measured inside the forward, disjoint)"
            )
        ]
        for h in self.hotspots:
            where = ", ".join(s.path or "(root)" for s in h.sites[:3])
            more = f" +{len(h.sites) - 3}" if len(h.sites) > 3 else ""
            lines.append(
                f"  {h.name}: {h.share:.1%} of the forward ({h.ms:.4g} ms on its own) at "
                f"{where}{more}"
            )
        lines += [f"note: {note}" for note in self.notes]
        if self.skipped:
            lines.append("not candidates:")
            lines += [f"  {s}" for s in self.skipped]
        return "\n".join(lines)


def _overlaps(a: Site, b: Site) -> bool:
    def inside(inner: str, outer: str) -> bool:
        return outer == "" or inner == outer or inner.startswith(outer + ".")

    if a.kind == "chain" and b.kind == "chain" and a.path == b.path:
        return bool(set(a.node_names) & set(b.node_names))
    if a.kind == "chain" and b.kind == "chain":
        return False
    # a patched module (module/block) overlaps whatever lies inside it, and a chain that calls it
    for x, y in ((a, b), (b, a)):
        if x.kind != "chain" and inside(y.path, x.path):
            return True
        if x.kind != "chain" and y.kind == "chain":
            owner_children = {f"{y.path}.{n}" if y.path else n for n in _called_modules(y)}
            if any(inside(x.path, c) or inside(c, x.path) for c in owner_children):
                return True
    return False


def _called_modules(site: Site) -> list[str]:
    if site.graph is None:
        return []
    names = set(site.node_names)
    called = [n.target for n in site.graph.nodes if n.name in names and n.op == "call_module"]
    return called + list(site.inlined)


def _matches_target(hotspot: Hotspot, targets) -> bool:
    if callable(targets):
        return bool(targets(hotspot))
    for target in targets:
        for site in hotspot.sites:
            if site.path == target or site.path.startswith(target + "."):
                return True
            if target in (type(site.module).__name__, hotspot.kind) and site.kind != "chain":
                return True
            if target == hotspot.kind or target in hotspot.label:
                return True
    return False


def find_hotspots(
    model: nn.Module,
    example_inputs,
    *,
    targets: Sequence[str] | Callable[[Hotspot], bool] | None = None,
    min_share: float = MIN_SHARE,
    max_hotspots: int = MAX_HOTSPOTS,
    profile: ModelProfile | None = None,
    paths: Sequence[str] | None = None,
) -> HotspotSearch:
    """Profile the model, form candidates, time them, keep the largest non-overlapping ones.

    targets: only hot spots at these module paths (or below), of these module class names,
    kinds ('module', 'chain', 'block') or with this text in their label; or a predicate.
    paths: form candidates at exactly these module paths only (the paths of the sites an
    earlier search chose: cudaforge.model.remembered_search), skipping the rest of the model.
    Raises HotspotError (naming what and why) when the forward fails or nothing qualifies."""
    args, kwargs = split_inputs(example_inputs)
    notes: list[str] = []
    args, kwargs = _without_cache(model, args, kwargs, notes)
    device = model_device(model, args, kwargs)
    try:
        profile = profile or profile_model(model, (*args,) if not kwargs else kwargs)
    except Exception as exc:
        raise HotspotError(
            f"{type(model).__name__} does not run on the example inputs: {error_line(exc)}"
        ) from exc
    if kwargs and args:
        raise HotspotError("pass example inputs as a tuple of arguments or a dict, not both")
    with torch.no_grad():
        forward_ms = time_call(lambda: model(*args, **kwargs), device, target_ms=40.0)
    modules = dict(model.named_modules())
    floor = min_share / 2 if targets is None else 0.0
    wanted = [p for p in modules if profile.share(p) >= floor or (targets and p in profile.modules)]
    if paths is not None:
        at = set(paths)
        wanted = [p for p in modules if p in at]
    calls = capture_calls(model, args, kwargs, wanted)
    skipped: list[Skipped] = []
    candidates: list[Candidate] = []
    for path in wanted:
        module = modules[path]
        call = calls.get(path)
        if call is None:
            continue
        what = type(module).__name__
        is_leaf = not any(True for _ in module.children())
        try:
            if is_torch_leaf(module):
                if isinstance(module, (*TRANSPARENT_MODULES, *DROPOUT_MODULES)):
                    continue
                if getattr(module, "inplace", False) is True:
                    skipped.append(Skipped(path, what, "works in place on its input"))
                    continue
                candidates.append(module_site(path, module, call))
                continue
            if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
                try:
                    candidates.append(block_site(path, module, call))
                except NotExtractable as exc:
                    if is_leaf:
                        raise
                    skipped.append(Skipped(path, what + " as a whole", str(exc)))
            if not is_leaf:
                found, refused = chain_sites(path, module, call)
                candidates += found
                skipped += [Skipped(path, what, reason) for reason in refused]
        except NotExtractable as exc:
            skipped.append(Skipped(path, what, str(exc)))
    # merge identical problems, check each problem once, time each site
    groups: dict[str, Hotspot] = {}
    for candidate in candidates:
        key = problem_hash(candidate.source)
        if key not in groups:
            try:
                check_problem(candidate, device)
            except NotExtractable as exc:
                skipped.append(Skipped(candidate.site.path, candidate.site.label, str(exc)))
                continue
            groups[key] = Hotspot(
                name=candidate.site.label, kind=candidate.site.kind, label=candidate.site.label,
                problem_source=candidate.source, sites=[],
            )  # fmt: skip
        groups[key].sites.append(candidate.site)
    for hotspot in groups.values():
        first = hotspot.sites[0]
        with torch.no_grad():
            first.ms = time_call(lambda s=first: s.run_original(s.inputs), device, target_ms=20)
        for site in hotspot.sites[1:]:
            site.ms = first.ms
        hotspot.share = min(1.0, hotspot.ms / forward_ms) if forward_ms > 0 else 0.0
    # Where candidates overlap, the fusion wins (a block over the chains in it, a chain over its
    # modules): it covers the same work, and timings of tiny modules are too noisy to decide.
    # A block of one op (an activation module) fuses nothing: it ranks with the modules.
    kind_rank = {"block": 0, "chain": 1, "layer": 2, "module": 3}

    def rank(h: Hotspot) -> int:
        return (
            kind_rank["module"] if h.kind == "block" and h.sites[0].ops <= 1 else kind_rank[h.kind]
        )

    ranked = sorted(groups.values(), key=lambda h: (rank(h), -h.ms))
    if targets is not None:
        ranked = [h for h in ranked if _matches_target(h, targets)]
    else:
        ranked = [h for h in ranked if h.share >= min_share]
    chosen: list[Hotspot] = []
    taken: list[Site] = []
    for hotspot in ranked:
        sites = [s for s in hotspot.sites if not any(_overlaps(s, t) for t in taken)]
        if not sites:
            continue
        hotspot.sites = sites
        hotspot.share = min(1.0, hotspot.ms / forward_ms) if forward_ms > 0 else 0.0
        chosen.append(hotspot)
        taken += sites
    coverage = _attribute(model, args, kwargs, chosen, device, forward_ms, notes)
    if targets is None:
        chosen = [h for h in chosen if h.share >= min_share]
    chosen = sorted(chosen, key=lambda h: -h.share)[:max_hotspots]
    coverage = sum(h.share for h in chosen) if coverage is not None else None
    _name(chosen)
    if not chosen:
        why = "; ".join(str(s) for s in skipped[:8]) or "no module takes enough of the time"
        raise HotspotError(
            f"no hot spot found in {type(model).__name__}"
            + (f" matching targets={targets!r}" if targets is not None else "")
            + f" (min_share={min_share:g}): {why}",
            skipped,
        )
    return HotspotSearch(chosen, skipped, profile, forward_ms, notes=notes, coverage=coverage)


def _attribute(model, args, kwargs, chosen: list[Hotspot], device, forward_ms, notes):
    """Each chosen hot spot's share of the forward, measured inside the model's forward
    (cudaforge.model.attribution: disjoint, at most 100% together); the coverage, or None when
    that run failed (the shares are then the sites' own times over the forward's, scaled down
    to 100% together where they add up to more, and a note says so)."""
    if not chosen:
        return 0.0
    try:
        found = attribute(model, args, kwargs, [h.sites for h in chosen], device)
    except Exception as exc:  # noqa: BLE001 - the hot spots stand; their shares are estimates
        total = sum(h.ms for h in chosen)
        scale = min(1.0, forward_ms / total) if total > 0 else 0.0
        for hotspot in chosen:
            hotspot.share = hotspot.ms * scale / forward_ms if forward_ms > 0 else 0.0
        notes.append(
            f"shares are the hot spots' own times, not measured inside the forward ({error_line(exc)})"
        )
        return None
    for index, hotspot in enumerate(chosen):
        hotspot.model_ms = found.ms[index]
        hotspot.share = min(1.0, found.share(index))
    notes += [f"not seen in the forward as captured: {m}" for m in found.missed]
    return found.coverage


def _without_cache(model: nn.Module, args: tuple, kwargs: dict, notes: list[str]):
    """A Hugging Face model builds a key/value cache object on every call unless told
    use_cache=False; a cache is no problem input (nor part of a training step), so the model's
    layers are captured without one: (args, kwargs) with use_cache=False added where the model's
    config asks for a cache and the call does not say."""
    config = getattr(model, "config", None)
    if not getattr(config, "use_cache", False) or "use_cache" in kwargs:
        return args, kwargs
    try:
        signature = inspect.signature(model.forward)
        if "use_cache" not in signature.parameters:
            return args, kwargs
        named = dict(signature.bind_partial(*args).arguments) if args else {}
    except (TypeError, ValueError):
        return args, kwargs
    notes.append(
        f"{type(model).__name__} is called with use_cache=False (its config asks for a key/value "
        "cache, which no extracted problem can take): call it so for the kernels to apply"
    )
    return (), {**named, **kwargs, "use_cache": False}


def _name(hotspots: list[Hotspot]) -> None:
    """Readable, unique names: the first site's path and the label."""
    seen: dict[str, int] = {}
    for hotspot in hotspots:
        site = hotspot.sites[0]
        base = f"{site.path or 'model'}: {hotspot.label}"
        count = seen.get(base, 0)
        seen[base] = count + 1
        hotspot.name = base if count == 0 else f"{base} #{count + 1}"


__all__ = [
    "MAX_HOTSPOTS",
    "MIN_SHARE",
    "Hotspot",
    "HotspotError",
    "HotspotSearch",
    "Skipped",
    "find_hotspots",
]
