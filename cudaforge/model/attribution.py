"""Where the model's forward spends its time among chosen hot spots: one more profiled run of the
whole forward with a range around every site (module hooks for a module, block or layer; the
owner's forward rewritten for the run, as a swap would, for a chain), so a hot spot's share is its
time inside the model, not the time of its site run alone (where launch gaps and warm caches make
it longer). Ranges never nest (the chosen sites do not overlap, and a range inside another
counts for nothing), so the shares are disjoint and add up to at most the whole forward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .owner_forward import OwnerForward
from .sites import Site
from .timing import profiled_forwards

_RANGE = "cudaforge.hotspot:"
_FORWARD = "cudaforge.forward"


@dataclass
class Attribution:
    """Time per forward (ms) of each hot spot inside the model's forward, and of the forward.
    time_kind: 'cuda' (GPU time) or 'cpu'. missed: sites whose range never opened (their module
    was called otherwise than captured), with the reason."""

    forward_ms: float
    ms: list[float]
    time_kind: str
    missed: list[str] = field(default_factory=list)

    def share(self, index: int) -> float:
        return self.ms[index] / self.forward_ms if self.forward_ms > 0 else 0.0

    @property
    def coverage(self) -> float:
        return sum(self.ms) / self.forward_ms if self.forward_ms > 0 else 0.0


class _RangedChain:
    """Stands in for a swapped chain in its owner's rewritten forward: runs the chain's own ops
    inside a profiler range."""

    def __init__(self, site: Site, index: int):
        self.site = site
        self.name = f"{_RANGE}{index}"
        self.owner_forward = None
        self.missed = ""

    def __call__(self, *args):
        with torch.autograd.profiler.record_function(self.name):
            return self.site.root(*args)

    def fell_back(self, reason: str) -> None:
        self.missed = reason


def _install(site_groups: Sequence[Sequence[Site]]):
    """Ranges around every site: (hook handles, owner forwards, chain stand-ins)."""
    handles, owners, chains = [], {}, []
    for index, sites in enumerate(site_groups):
        name = f"{_RANGE}{index}"
        for site in sites:
            if site.kind == "chain":
                stand_in = _RangedChain(site, index)
                owner = owners.get(id(site.module))
                if owner is None:
                    owner = owners[id(site.module)] = OwnerForward(site.module, site)
                    object.__setattr__(site.module, "forward", owner)
                owner.add(stand_in)
                chains.append(stand_in)
                continue
            stack: list = []

            def enter(module, args, name=name, stack=stack):
                scope = torch.autograd.profiler.record_function(name)
                scope.__enter__()
                stack.append(scope)

            def leave(module, args, output, stack=stack):
                if stack:
                    stack.pop().__exit__(None, None, None)

            handles.append(site.module.register_forward_pre_hook(enter))
            handles.append(site.module.register_forward_hook(leave))
    return handles, list(owners.values()), chains


def attribute(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    site_groups: Sequence[Sequence[Site]],
    device,
    *,
    repeat: int = 3,
) -> Attribution:
    """Profile `repeat` forwards (after one warm-up) with a range around each group's sites;
    the time per forward of each group and of the whole forward."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    handles, owners, chains = _install(site_groups)
    try:
        prof = profiled_forwards(model, args, kwargs, device, repeat, label=_FORWARD)
    finally:
        for handle in handles:
            handle.remove()
        for owner in owners:
            owner.uninstall()

    def span(event) -> float:  # microseconds
        if on_gpu:
            value = getattr(event, "device_time_total", None)
            return float(value if value is not None else getattr(event, "cuda_time_total", 0.0))
        return float(event.cpu_time_total)

    totals = [0.0] * len(site_groups)
    forward_us = 0.0
    for event in prof.events():
        if not _host_side(event):
            continue  # the GPU's copy of a range (kineto's annotation): its kernels count once
        if event.name == _FORWARD:
            forward_us += span(event)
        elif event.name.startswith(_RANGE) and not _inside_another(event):
            totals[int(event.name[len(_RANGE) :])] += span(event)
    missed = [f"{c.site.path or '(root)'}: {c.missed}" for c in chains if c.missed]
    return Attribution(
        forward_ms=forward_us / 1e3 / repeat,
        ms=[t / 1e3 / repeat for t in totals],
        time_kind="cuda" if on_gpu else "cpu",
        missed=missed,
    )


def _host_side(event) -> bool:
    kind = getattr(event, "device_type", None)
    return kind is None or str(kind).endswith("CPU")


def _inside_another(event) -> bool:
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if parent.name.startswith(_RANGE):
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


__all__ = ["Attribution", "attribute"]
