"""A model's inference forward replayed as one CUDA graph: for models whose GPU waits for the
host once kernels have cut their GPU time.

Every swapped hot spot costs host time per call (its check, the kernel's own Python, the
launch). On the H200, ResNet-50 at batch 64 issues its eager forward in about 4 ms against 4.7 ms
of GPU work; with six kernels in, the GPU work fell to 3.0 ms while the host took 4.4 ms, so the
forward was paced by the host (benchmarks/RESULTS.md). A replayed graph is issued in one launch.

`graphed(model, example_inputs)` captures `model(*example_inputs)` under no_grad, after a few
warm-up calls on a side stream (the allocator and lazy initialization settle there), the way the
harness captures a forward to time its replays (harness/graphs.py). A call
whose tensor arguments match the captured ones (shape, dtype, device, strides) and whose other
arguments are equal, with gradients off and the model in the mode it was captured in, copies its
tensors into the graph's inputs and replays; its outputs are clones of the graph's (the next
replay overwrites those) unless clone_outputs=False. Any other call runs the model eagerly, with
a FallbackWarning the first time, the reason in `.fallback_reason`.

What a replay does not do: run Python. The swapped hot spots' per-call checks, counts and shadow
checks ran during the capture only; hooks do not fire. Parameters changed in place (an optimizer
step, load_state_dict) are seen by the replay; parameters replaced by new tensors are not: call
`graphed` again.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from ..errors import NoGPUError
from ..harness.evaluation import one_line
from ..harness.graphs import capture_forward
from .swap_errors import FallbackWarning, SwapError


def _signature(t: Tensor) -> tuple:
    return (t.shape, t.dtype, t.device, t.stride())


def mismatch(captured: Sequence[Any], given: Sequence[Any]) -> str:
    """Why arguments `given` cannot use a graph captured for `captured` ("" when they can)."""
    if len(given) != len(captured):
        return f"{len(given)} arguments, the graph was captured with {len(captured)}"
    for i, (c, g) in enumerate(zip(captured, given)):
        if isinstance(c, Tensor):
            if not isinstance(g, Tensor):
                return f"argument {i} is a {type(g).__name__}, not a tensor"
            if _signature(g) != _signature(c):
                return (f"argument {i} is {tuple(g.shape)} {g.dtype} on {g.device}, strides "
                        f"{g.stride()}; the graph was captured for {tuple(c.shape)} {c.dtype} "
                        f"on {c.device}, strides {c.stride()}")  # fmt: skip
        elif isinstance(g, Tensor) or g != c:
            return f"argument {i} is {g!r}, the graph was captured with {c!r}"
    return ""


class GraphedForward(nn.Module):
    """`model`'s forward for one set of input shapes, replayed as a CUDA graph (module
    docstring). `.replays` and `.fallbacks` count the calls; `.model` is the model itself."""

    def __init__(self, model: nn.Module, example_inputs: Sequence[Any], *, warmup: int = 3,
                 clone_outputs: bool = True):  # fmt: skip
        super().__init__()
        example_inputs = tuple(example_inputs)
        tensors = [t for t in example_inputs if isinstance(t, Tensor)]
        if not tensors or any(t.device.type != "cuda" for t in tensors):
            raise NoGPUError("graphed() needs the model's tensor inputs on a CUDA device")
        self.model = model
        self.clone_outputs = clone_outputs
        self.training_at_capture = model.training
        self.replays = 0
        self.fallbacks = 0
        self.fallback_reason = ""
        self._warned = False
        # read once: walking the parameters on every call costs host time the graph saves
        self._params_need_grad = any(p.requires_grad for p in model.parameters())
        device = tensors[0].device
        try:
            with torch.no_grad():
                captured = capture_forward(torch, model, list(example_inputs), device,
                                           warmup=max(1, warmup))  # fmt: skip
        except Exception as exc:
            raise SwapError(
                f"the forward cannot be captured in a CUDA graph: {type(exc).__name__}: "
                f"{one_line(exc, 300)} (a forward that synchronizes, reads a tensor on the host "
                "or changes shape from call to call cannot be replayed; run it eagerly)"
            ) from exc
        # the graph's own inputs (clones of the examples, same strides) and outputs
        self._graph, self._static, self._outputs = captured.graph, captured.inputs, captured.output

    def why_not_replayed(self, args: Sequence[Any]) -> str:
        """Why this call runs eagerly ("" when it replays)."""
        if torch.is_grad_enabled() and (self._params_need_grad or any(
                isinstance(a, Tensor) and a.requires_grad for a in args)):  # fmt: skip
            return "gradients are enabled (a graph is replayed for inference only)"
        if self.model.training != self.training_at_capture:
            mode = "training" if self.model.training else "eval"
            return f"the model is in {mode} mode now, not as it was captured"
        return mismatch(self._static, args)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        reason = "keyword arguments" if kwargs else self.why_not_replayed(args)
        if reason:
            self.fallbacks += 1
            self.fallback_reason = reason
            if not self._warned:
                self._warned = True
                warnings.warn(f"graphed(): ran the model eagerly: {reason}", FallbackWarning,
                              stacklevel=2)  # fmt: skip
            return self.model(*args, **kwargs)
        for static, a in zip(self._static, args):
            if isinstance(static, Tensor) and a is not static:
                static.copy_(a)
        self._graph.replay()
        self.replays += 1
        if not self.clone_outputs:
            return self._outputs
        return pytree.tree_map_only(Tensor, torch.clone, self._outputs)


def graphed(model: nn.Module, example_inputs: Sequence[Any], *, warmup: int = 3,
            clone_outputs: bool = True) -> GraphedForward:  # fmt: skip
    """`model`'s inference forward captured as one CUDA graph for example_inputs' shapes (this
    module's docstring). Raises NoGPUError without CUDA inputs, SwapError when the forward
    cannot be captured."""
    return GraphedForward(model, example_inputs, warmup=warmup, clone_outputs=clone_outputs)


__all__ = ["GraphedForward", "graphed", "mismatch"]
