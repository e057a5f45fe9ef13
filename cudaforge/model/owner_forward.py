"""The forward a swap installs on a module whose code holds swapped chains (`OwnerForward`: its
traced graph with each chain replaced by one call), and what it shares with a swapped hot spot's
own forward: standing in for the original forward (its code object and signature, which
torch.export reads) and matching a call's non-tensor arguments."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import fx, nn

from .codegen import device_index
from .hotspot_op import bypassing
from .sites import Site
from .swap_errors import SwapError
from .tracing import fetch_attribute as _fetch


def forward_code(forward):
    """The code object of the forward a swap stands in for (torch.export reads it)."""
    code = getattr(forward, "__code__", None)
    return code if code is not None else forward_code.__code__


def forward_signature(forward):
    """The signature of the forward a swap stands in for; (*args, **kwargs) if it has none."""
    try:
        return inspect.signature(forward)
    except (TypeError, ValueError):
        return inspect.Signature(
            [
                inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
            ]
        )


class _SiteCall(nn.Module):
    """The call of a swapped chain inside its owner's rewritten graph."""

    def __init__(self, swap):  # its SwappedHotspot
        super().__init__()
        self.swap = swap

    def forward(self, *args):
        return self.swap(*args)


class OwnerForward:
    """The forward of a module whose code holds swapped chains: its traced graph with each chain
    replaced by one call, run when the module is called as it was traced (same argument shapes,
    dtypes and devices, same non-tensor arguments, same mode), else its original forward."""

    def __init__(self, owner: nn.Module, site: Site):
        self.owner = owner
        self.previous = owner.__dict__.get("forward")
        self.original_forward = owner.forward
        self.graph = site.graph
        self.constants = dict(site.constants)
        self.call = site.owner_call
        self.specs = list(site.owner_specs)
        self.training = site.owner_training
        self.swaps: list[Any] = []  # the SwappedHotspots of its chains
        self.module: fx.GraphModule | None = None
        self.warned = False
        # a plain call's (shape, dtype, device index) per input, for _match's fast path; None:
        # not prepared yet, (): the call is not plain (its arguments need the full match)
        self._fast: tuple | None = None

    @property
    def __code__(self):
        return forward_code(self.original_forward)

    @property
    def __signature__(self):
        return forward_signature(self.original_forward)

    def add(self, swap) -> None:
        if swap.site.graph is not self.graph:
            raise SwapError(f"{swap.name}: traced from another call of {swap.site.path}")
        self.swaps.append(swap)
        swap.owner_forward = self
        self._rebuild()

    def remove(self, swap) -> None:
        if swap in self.swaps:
            self.swaps.remove(swap)
            swap.owner_forward = None
        if self.swaps:
            self._rebuild()
        else:
            self.uninstall()

    def uninstall(self) -> None:
        if self.owner.__dict__.get("forward") is self:
            if self.previous is None:
                del self.owner.__dict__["forward"]
            else:
                object.__setattr__(self.owner, "forward", self.previous)
        for swap in self.swaps:
            swap.owner_forward = None
        self.swaps = []

    def _rebuild(self) -> None:
        graph = fx.Graph()
        copies: dict[fx.Node, fx.Node] = {}
        result = graph.graph_copy(self.graph, copies)
        graph.output(result)
        by_name = {old.name: new for old, new in copies.items()}
        root: dict[str, Any] = {}
        for index, swap in enumerate(self.swaps):
            site = swap.site
            target = f"cudaforge_hotspot_{index}"
            last = by_name[site.output_name]
            with graph.inserting_after(last):
                call = graph.call_module(target, tuple(by_name[n] for n in site.external))
            last.replace_all_uses_with(call, delete_user_cb=lambda user, c=call: user is not c)
            for name in reversed(site.node_names):
                node = by_name[name]
                if node.users:
                    raise SwapError(f"{swap.name}: node {name} is still used after the swap")
                graph.erase_node(node)
            by_name[site.output_name] = call
            root[target] = _SiteCall(swap)
        for node in graph.nodes:
            node.meta.pop("value", None)  # observed values: not needed any more
            if node.op in ("get_attr", "call_module") and node.target not in root:
                if node.target in self.constants:
                    root[node.target] = self.constants[node.target]
                else:
                    root[node.target] = _fetch(self.owner, node.target)
        graph.lint()
        self.module = fx.GraphModule(root, graph, class_name=f"{type(self.owner).__name__}Swapped")

    def __call__(self, *args, **kwargs):
        if not bypassing():
            values, reason = self._match(args, kwargs)
            if values is not None:
                return self.module(*values)
            if not torch.compiler.is_compiling():
                for swap in self.swaps:
                    swap.fell_back(f"its module was called differently ({reason})")
        return self.original_forward(*args, **kwargs)

    def _match(self, args, kwargs):
        if self.owner.training != self.training:
            return None, "in the other training/eval mode"
        fast = self._fast
        if fast is None:
            fast = self._fast = self._prepare_fast()
        if fast and not kwargs and len(args) == len(fast):  # the verified call, checked cheaply
            for value, (shape, dtype, device) in zip(args, fast):
                if type(value) is not torch.Tensor or value.dtype is not dtype:
                    break
                if value.shape != shape or value.get_device() != device:
                    break
            else:
                return list(args), ""
        values, why = self.call.match(args, kwargs)
        if values is None:
            return None, why
        for value, name, expected in zip(values, self.call.names, self.specs):
            if value.shape != expected.shape or value.dtype != expected.dtype:
                return None, f"{name} is {value.dtype}{list(value.shape)}"
            if value.device != expected.device:
                return None, f"{name} is on {value.device}"
        return values, ""

    def _prepare_fast(self) -> tuple:
        if not self.call.plain:
            return ()
        fast = [(torch.Size(s.shape), s.dtype, device_index(s.device)) for s in self.specs]
        return tuple(fast) if all(index is not None for *_, index in fast) else ()


__all__ = ["OwnerForward", "forward_code", "forward_signature"]
