"""Putting verified kernels into a model, and taking them out again.

A swap patches a module's `forward` on the instance (its class, parameters, state_dict keys and
hooks are untouched): for a "module", "block" or "layer" hot spot, the module's own forward; for a
"chain", the forward of the module whose code holds the chain, replaced by its traced graph in
which the chain's nodes became one call. `restore(model)` deletes those instance attributes.

This module is the swap's public face: `swap_in` (build, check, time, install), `swaps`, `stats`
and `restore` for a whole model, and the errors, warnings and comparison a caller sees. The parts:
candidate (build and bind), swapped_hotspot (a swapped site, its per-call checks, fallbacks and
shadow checks), owner_forward (the rewritten forward around swapped chains), hotspot_op (the
custom op and its autograd), swap_checks (verify, check_gradients, measure), swap_compare and
swap_errors.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .backward import attach_backward
from .candidate import build_candidate
from .owner_forward import OwnerForward
from .sites import Site
from .swap_checks import check_gradients, measure, verify
from .swap_compare import compare, tolerances
from .swap_errors import DriftWarning, FallbackWarning, SwapError
from .swapped_hotspot import SwappedHotspot


def swap_in(
    site: Site,
    source: str,
    problem_source: str,
    *,
    name: str = "",
    training: bool = False,
    verify_every: int = 0,
    tolerance: float | None = None,
    trials: int = 3,
    install: bool = True,
    backward: tuple[str, str] | None = None,
    timed: bool = True,
) -> SwappedHotspot:
    """Build the candidate for a site, verify it (and its gradients when training), time it and
    install it. Raises SwapError or VerificationError, leaving the model untouched. backward:
    (source, problem source) of a verified backward kernel (cudaforge.model.backward), used in
    training once it passes the gradient check here; with training and no such kernel, calls
    that autograd records run the original (a recompute would make the step slower than eager).
    timed=False: not timed here (the other sites of a hot spot run the same problem: its first
    site's times stand for them)."""
    candidate = build_candidate(source, problem_source, site)
    swap = SwappedHotspot(
        site, candidate, name=name, source=source, problem_source=problem_source,
        verify_every=verify_every, tolerance=tolerance,
    )  # fmt: skip
    verify(swap, trials=trials, tolerance=tolerance)
    if training:
        if backward is not None:
            attach_backward(swap, *backward)
        check_gradients(swap, tolerance=tolerance)
        swap.original_under_grad = True
    if timed:
        measure(swap)
    if install:
        swap.install()
    return swap


# ---------------------------------------------------------------- the model level


def swaps(model: nn.Module) -> list[SwappedHotspot]:
    """The swapped hot spots installed in a model."""
    found: list[SwappedHotspot] = []
    for module in model.modules():
        current = module.__dict__.get("forward")
        if isinstance(current, SwappedHotspot):
            found.append(current)
        elif isinstance(current, OwnerForward):
            found.extend(current.swaps)
    return found


def stats(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Per swapped hot spot: kernel calls, fallbacks, shadow checks, whether on, the last reason."""
    found: dict[str, dict[str, Any]] = {}
    for swap in swaps(model):
        key, n = swap.name, 1
        while key in found:
            n += 1
            key = f"{swap.name} #{n}"
        found[key] = {
            **swap.stats.to_dict(),
            "enabled": swap.enabled,
            "off_reason": swap.off_reason,
            "graphs": swap.graphs.to_dict() if swap.graphs is not None else None,
        }
    return found


def site_graphs(model: nn.Module, on: bool = True, *, limit: int | None = None,
                sightings: int | None = None) -> int:  # fmt: skip
    """Replay each swapped site's inference calls from CUDA graphs (on), or stop and free their
    memory (off); returns how many swapped sites there are. A call is replayed once the same
    tensors (addresses, shapes, strides, dtypes) came `sightings` times (default 3), at most
    `limit` graphs per site (default 4); calls while the last replay's outputs are still held,
    calls that autograd records and calls inside another capture run as usual
    (cudaforge.model.site_graphs). `stats(model)[name]["graphs"]` counts the replays."""
    found = swaps(model)
    for swap in found:
        swap.use_graphs(on, limit=limit, sightings=sightings)
    return len(found)


class GraphSwitch:
    """Site graphs of their own for the swapped sites `found` (use_graphs), attached to them or
    not per call with set(on): the same model timed with and without them side by side."""

    def __init__(self, found: list[SwappedHotspot]):
        self.swaps = list(found)
        for swap in self.swaps:
            swap.use_graphs(True)
        self.graphs = [swap.graphs for swap in self.swaps]

    def set(self, on: bool) -> None:
        for swap, graphs in zip(self.swaps, self.graphs):
            swap.graphs = graphs if on else None

    def release(self) -> None:
        """Every site's graphs freed (use_graphs(False)), wherever set() left them."""
        self.set(True)
        for swap in self.swaps:
            swap.use_graphs(False)


def restore(model: nn.Module) -> nn.Module:
    """Undo every swap in `model` (its original forwards come back); returns the model."""
    for module in model.modules():
        current = module.__dict__.get("forward")
        if isinstance(current, (SwappedHotspot, OwnerForward)):
            current.uninstall()
    return model


__all__ = [
    "DriftWarning",
    "FallbackWarning",
    "GraphSwitch",
    "SwapError",
    "compare",
    "restore",
    "site_graphs",
    "stats",
    "swap_in",
    "swaps",
    "tolerances",
]
