"""A verified candidate as a module of the user's model: its source loaded as a Python module,
`ModelNew` instantiated like the problem's `Model` on the site's device, and bound to the site's
live parameters and buffers by the problem's names."""

from __future__ import annotations

import hashlib
import linecache
import sys
import types
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .codegen import load_problem
from .sites import Site
from .swap_errors import SwapError


def build_candidate(source: str, problem_source: str, site: Site) -> nn.Module:
    """Instantiate a candidate's ModelNew like the problem's Model and bind it to the site's live
    parameters and buffers (by the problem's names). Raises SwapError."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    name = f"cudaforge_swapped_{digest}"
    filename = f"<cudaforge kernel {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name, "a verified cudaforge candidate")
        module.__file__ = filename
        sys.modules[name] = module  # pickling and dataclasses look classes up there
        try:
            exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102
        except Exception as exc:
            sys.modules.pop(name, None)
            raise SwapError(f"the candidate does not load: {type(exc).__name__}: {exc}") from exc
    model_new = getattr(module, "ModelNew", None)
    if model_new is None:
        raise SwapError("the candidate defines no ModelNew")
    problem = load_problem(problem_source)
    device = site_device(site)
    try:
        with torch.device(device):
            candidate = model_new(*problem.get_init_inputs())
    except Exception as exc:
        raise SwapError(f"ModelNew(...) failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(candidate, nn.Module):
        raise SwapError("ModelNew(...) is not an nn.Module")
    if not site.module.training:
        candidate.eval()
    bind(candidate, site.problem_keys, site.tensors)
    return candidate


def site_device(site: Site) -> torch.device:
    for tensor in list(site.inputs) + list(site.tensors):
        return tensor.device
    return torch.device("cpu")


def bind(candidate: nn.Module, keys: Sequence[str], tensors: Sequence[Tensor]) -> None:
    """Make the candidate's parameters/buffers named `keys` the given (live) tensors."""
    for key, tensor in zip(keys, tensors):
        path, _, name = key.rpartition(".")
        try:
            owner = candidate.get_submodule(path) if path else candidate
        except AttributeError:
            raise SwapError(f"ModelNew has no submodule {path!r} (for {key!r})") from None
        if name in owner._parameters:
            slot, table = owner._parameters[name], owner._parameters
            value = tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, False)
        elif name in owner._buffers:
            slot, table, value = owner._buffers[name], owner._buffers, tensor
        else:
            raise SwapError(
                f"ModelNew has no parameter or buffer {key!r} (it must create them like Model)"
            )
        if slot is not None and tuple(slot.shape) != tuple(tensor.shape):
            raise SwapError(
                f"ModelNew's {key!r} has shape {tuple(slot.shape)}, the model's {tuple(tensor.shape)}"
            )
        table[name] = value


__all__ = ["bind", "build_candidate", "site_device"]
