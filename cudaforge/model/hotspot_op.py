"""The custom op `cudaforge::hotspot(handle, inputs, params) -> outputs` that runs a swapped
kernel, so that torch.compile, CUDA graphs and torch.export see one opaque op: the handle registry
of swapped hot spots, `bypassed` (originals run inside it), the fake implementation (the original
run on fake tensors gives the output shapes) and autograd.

Backward recomputes the original op and differentiates it (so gradients are the original's), or
calls the candidate's own `backward` when it has one and it passed the gradient check. A
candidate's `backward(self, grad_outputs, inputs)` returns (gradients of the inputs, in order; a
dict of gradients of the parameters by their names in the problem).

In eager mode a call that autograd records goes through `EagerHotspot`, a plain
autograd.Function with the same forward and backward: the custom op's dispatch (schema checks,
argument flattening, the autograd kernel) paced GPT-2's training step on the H200, whose host
took 42.0 ms per step with the op against eager's 32.1 ms (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Any

import torch
from torch import Tensor

from .sites import Site
from .swap_errors import SwapError

# handle -> its SwappedHotspot (cudaforge.model.swapped_hotspot), which registers itself
_swaps: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_handles = itertools.count(1)
_bypass_depth = 0  # > 0 while originals run (fake impl, recompute, checks): no kernels then


@contextlib.contextmanager
def bypassed():
    """Swapped sites run their original code inside this block."""
    global _bypass_depth
    _bypass_depth += 1
    try:
        yield
    finally:
        _bypass_depth -= 1


def bypassing() -> bool:
    """True inside `bypassed()`: swapped sites run their original code now."""
    return _bypass_depth > 0


def register(swap) -> int:
    """A new handle for a swapped hot spot; the registry holds it weakly."""
    handle = next(_handles)
    _swaps[handle] = swap
    return handle


def _lookup(handle: int):
    swap = _swaps.get(handle)
    if swap is None:
        raise SwapError(f"no swapped hot spot has handle {handle} (restored or garbage collected)")
    return swap


@torch.library.custom_op("cudaforge::hotspot", mutates_args=())
def hotspot(handle: int, inputs: list[Tensor], params: list[Tensor]) -> list[Tensor]:
    """Run swapped hot spot `handle`'s kernel on its inputs and parameters."""
    return _run(handle, inputs, params)


def _run(handle: int, inputs: list[Tensor], params: list[Tensor]) -> list[Tensor]:
    return _called(handle).run_kernel(list(inputs), list(params))


def _called(handle: int):
    """The swap of `handle`, its op call counted (SwapStats.op_calls)."""
    swap = _lookup(handle)
    swap.stats.op_calls += 1
    return swap


@hotspot.register_fake
def _hotspot_fake(handle, inputs, params):
    swap = _lookup(handle)
    with bypassed():
        outputs = swap.site.run_original(list(inputs), list(params))
    # the layout SwappedHotspot._laid_out gives the real outputs: the original's, where dense
    return [torch.empty_like(o) for o in outputs]


def _hotspot_setup(ctx, inputs, output) -> None:
    handle, tensors, params = inputs
    ctx.handle = handle
    ctx.count = len(tensors)
    ctx.save_for_backward(*tensors, *params)


def _hotspot_backward(ctx, grads):
    saved = ctx.saved_tensors
    inputs, params = list(saved[: ctx.count]), list(saved[ctx.count :])
    input_grads, param_grads = _lookup(ctx.handle).gradients(list(grads), inputs, params)
    return None, input_grads, param_grads


hotspot.register_autograd(_hotspot_backward, setup_context=_hotspot_setup)

# The same call for graphs that need no gradient (inference under torch.compile), defined
# through torch.library.Library with a single CompositeExplicitAutograd kernel: it skips
# custom_op's Python layers (the autograd wrapper's no-grad path, its redispatch, the backend
# wrapper): `benchmarks/swap_overhead.py` times what each op adds to a kernel call. Twelve calls
# of the custom op paced GPT-2's compiled forward on the H200 (benchmarks/RESULTS.md,
# 2026-12-04). Only for calls where no input requires a gradient.
_inference_library = torch.library.Library("cudaforge", "FRAGMENT")
_inference_library.define("hotspot_infer(int handle, Tensor[] inputs, Tensor[] params) -> Tensor[]")


def _hotspot_infer(handle: int, inputs: list[Tensor], params: list[Tensor]) -> list[Tensor]:
    return _called(handle).run_inference(list(inputs), list(params))


_inference_library.impl("hotspot_infer", _hotspot_infer, "CompositeExplicitAutograd")
torch.library.register_fake("cudaforge::hotspot_infer", _hotspot_fake, lib=_inference_library)


class EagerHotspot(torch.autograd.Function):
    """The custom op's forward and backward as an autograd.Function, for eager calls:
    apply(swap, count, *inputs, *params), the first `count` tensors being the inputs."""

    @staticmethod
    def forward(ctx, swap, count, *tensors):
        inputs, params = list(tensors[:count]), list(tensors[count:])
        _hotspot_setup(ctx, (swap.handle, inputs, params), None)
        return tuple(swap.run_kernel(inputs, params))

    @staticmethod
    def backward(ctx, *grads):
        _, input_grads, param_grads = _hotspot_backward(ctx, grads)
        return (None, None, *input_grads, *param_grads)


def recompute_gradients(site: Site, grads, inputs, params, trainable=None):
    """Backward by recomputing the original with autograd: (input grads, parameter grads).
    trainable[i] False: params[i] is a buffer (no gradient)."""
    trainable = trainable if trainable is not None else [True] * len(params)
    with torch.enable_grad(), bypassed():
        ins = [gradient_leaf(t) for t in inputs]
        ps = [gradient_leaf(t) if train else t.detach() for t, train in zip(params, trainable)]
        outputs = site.run_original(ins, ps)
        pairs = [
            (o, g if g is not None else torch.zeros_like(o))
            for o, g in zip(outputs, grads)
            if isinstance(o, Tensor) and o.requires_grad
        ]
        wanted = [t for t in ins + ps if t.requires_grad]
        found = (
            torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                allow_unused=True)
            if pairs and wanted
            else [None] * len(wanted)
        )  # fmt: skip
    it = iter(found)
    every = [next(it) if t.requires_grad else None for t in ins + ps]
    return every[: len(ins)], every[len(ins) :]


def gradient_leaf(t: Tensor) -> Tensor:
    """A detached view of t that autograd differentiates (when its dtype can have gradients)."""
    leaf = t.detach()
    if leaf.is_floating_point() or leaf.is_complex():
        leaf.requires_grad_(True)
    return leaf


__all__ = [
    "EagerHotspot",
    "bypassed",
    "bypassing",
    "gradient_leaf",
    "hotspot",
    "recompute_gradients",
    "register",
]
