"""Which swapped kernels stay in the model when the user compiles it with torch.compile.

A swapped kernel is an opaque custom op to Inductor: it cannot fuse across it, and where Inductor
would have generated something as fast as the kernel from the original code (a fused MLP, a
matmul padded to an aligned size), keeping the kernel makes the compiled model slower. On the
H200, GPT-2 with two kernels took 14.4 ms eagerly against eager's 22.1 ms, but 11.5 ms under
torch.compile against compile's own 8.1 ms (RESULTS.md, "optimize() on real models").

`choose_under_compile(model)` times each swapped hot spot's kernel against torch.compile of its
original code on the captured inputs, both queued behind a busy GPU (the GPU's own time), and
keeps the kernel under compile only where it is faster by `margin`. The others step aside while
torch.compile traces the model (SwappedHotspot.under_compile False): dynamo then traces their
original code, which Inductor fuses as if nothing had been swapped. Eager calls keep the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .swap import swaps
from .swap_checks import random_like
from .timing import time_call


@dataclass
class CompileChoice:
    name: str
    kernel_ms: float
    compiled_ms: float | None  # torch.compile of the original, on the captured inputs
    under_compile: bool
    reason: str = ""
    sites: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def choose_under_compile(
    model: nn.Module,
    *,
    margin: float = 1.02,
    backend: str = "inductor",
    say: Callable[[str], None] | None = None,
) -> list[CompileChoice]:
    """For every swapped hot spot of `model`: its kernel's time against its original's under
    torch.compile(backend=...), and whether the kernel stays in when the model is compiled
    (faster by `margin`). A hot spot whose original fails to compile keeps its kernel."""
    groups: dict[tuple[str, str], list] = {}
    for swap in swaps(model):  # the sites of one hot spot share its kernel: chosen once
        groups.setdefault((swap.problem_source, swap.source), []).append(swap)
    choices = []
    for group in groups.values():
        choice = _choose(group[0], margin, backend)
        choice.sites = len(group)
        for swap in group:
            swap.under_compile = choice.under_compile
        choices.append(choice)
        if say is not None:
            compiled_text = "n/a" if choice.compiled_ms is None else f"{choice.compiled_ms:.4g} ms"
            say(f"cudaforge: {choice.name}: kernel {choice.kernel_ms:.4g} ms, torch.compile of the "
                f"original {compiled_text}: {'kept' if choice.under_compile else 'steps aside'} "
                f"under torch.compile{'' if choice.under_compile else ' (' + choice.reason + ')'}")
    return choices


def _choose(swap, margin: float, backend: str) -> CompileChoice:
    site = swap.site
    # optimize() drops the captured inputs once a swap is in (Site.release): random ones then
    inputs, tensors = list(site.inputs) or _inputs_like(site.input_specs), list(site.tensors)
    # the device the hot spot runs on (from the inputs as made here: a released site has none;
    # taking the CPU for it timed a GPU kernel's launch, not its run)
    device = next((t.device for t in inputs + tensors), torch.device("cpu"))
    swap.under_compile = False  # dynamo traces the original while this compiles it
    torch._dynamo.reset()
    compiled = torch.compile(lambda *xs: site.run_original(list(xs)), backend=backend,
                             dynamic=False)  # fmt: skip
    try:
        with torch.no_grad():
            compiled(*inputs)
            compiled_ms = time_call(lambda: compiled(*inputs), device, queued=True)
            kernel_ms = time_call(lambda: swap.run_kernel(inputs, tensors), device, queued=True)
    except Exception as exc:  # noqa: BLE001 - the original does not compile: keep the kernel
        return CompileChoice(swap.name, swap.check.kernel_ms or float("nan"), None, True,
                             f"the original does not compile: {type(exc).__name__}: "
                             f"{str(exc)[:200]}")  # fmt: skip
    finally:
        torch._dynamo.reset()
    keep = kernel_ms * margin < compiled_ms  # the caller sets under_compile on every site
    reason = "" if keep else "torch.compile of the original code is as fast or faster"
    return CompileChoice(swap.name, kernel_ms, compiled_ms, keep, reason)


def _inputs_like(specs) -> list[torch.Tensor]:
    """Random tensors of the verified shapes, dtypes, devices and strides (swap_checks.random_like
    on zeroed templates: integers come out zero, as no observed range is left)."""
    templates = [
        torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=s.device).zero_()
        for s in specs
    ]
    return random_like(templates, seed=0)


__all__ = ["CompileChoice", "choose_under_compile"]
