"""The hot-spot search of a model remembered in the store, so that load() searches again only
where an earlier run found its hot spots.

The full search (cudaforge.model.hotspots.find_hotspots) forms and checks a candidate at every
module that takes time, each traced, extracted and run standalone: most of load()'s time on a
transformer. A run that found hot spots records the module paths of their sites under the
model's key: its class, every module's path and class, every parameter's name, shape and dtype,
its training mode and the example inputs' shapes and dtypes. load() of a model with the same key
searches those paths only (the profile, the candidates there, the shares inside the forward as
before), and falls back to the full search when that finds nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import torch
from torch import nn

from .hotspots import HotspotError, HotspotSearch, find_hotspots
from .store import KernelStore


def _describe(value) -> object:
    if isinstance(value, torch.Tensor):
        return [list(value.shape), str(value.dtype)]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    return type(value).__name__


def model_key(model: nn.Module, example_inputs) -> str:
    """What a remembered search is filed under (see the module docstring): a sha256."""
    described = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "modules": [[path, type(m).__qualname__, m.training] for path, m in model.named_modules()],
        "parameters": [[n, list(p.shape), str(p.dtype)] for n, p in model.named_parameters()],
        "inputs": _describe(example_inputs),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def search(
    model: nn.Module,
    example_inputs,
    *,
    store: KernelStore | None,
    use_remembered: bool,
    say: Callable[[str], None] = lambda text: None,
    **options,
) -> HotspotSearch:
    """find_hotspots(model, example_inputs, **options), over the remembered paths first when
    `use_remembered` and the store has them; the chosen sites' paths are remembered after."""
    key = model_key(model, example_inputs) if store is not None else None
    paths = store.searched(key) if key is not None and use_remembered else None
    found = None
    if paths:
        try:
            found = find_hotspots(model, example_inputs, paths=paths, **options)
            say(f"searched only the {len(paths)} module(s) where an earlier run found hot spots")
        except HotspotError:
            say("the hot spots remembered for this model are gone; searching the whole model")
    if found is None:
        found = find_hotspots(model, example_inputs, **options)
    if key is not None:
        store.remember_search(key, [site.path for hotspot in found for site in hotspot.sites])
    return found


__all__ = ["model_key", "search"]
