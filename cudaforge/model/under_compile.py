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

Per hot spot the GPU's time decides, but each kept kernel also costs host time per call (the
custom op's dispatch, the candidate's Python) that the compiled original does not. On the H200,
ResNet-50 compiled with six kernels that each beat Inductor on their hot spot took 3.80 ms
against compile's 3.29 ms: 2.26 ms of GPU work, but 4.31 ms of host time to issue it. Given the
model's example inputs, the choice is then checked on the whole compiled model against the
model compiled with every kernel aside; while it is not faster by `margin`, the kept kernel that
gains least steps aside too (one more compile of the model each time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .swap import swaps
from .swap_checks import random_like
from .timing import model_device, split_inputs, time_call


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
    example_inputs=None,
    *,
    margin: float = 1.02,
    backend: str = "inductor",
    say: Callable[[str], None] | None = None,
) -> list[CompileChoice]:
    """For every swapped hot spot of `model`: its kernel's time against its original's under
    torch.compile(backend=...), and whether the kernel stays in when the model is compiled
    (faster by `margin`). A hot spot whose original fails to compile keeps its kernel. With
    `example_inputs`, the kept kernels are then checked on the whole compiled model (the
    module docstring)."""
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
            say(
                f"cudaforge: {choice.name}: kernel {choice.kernel_ms:.4g} ms, torch.compile of the "
                f"original {compiled_text}: {'kept' if choice.under_compile else 'steps aside'} "
                f"under torch.compile{'' if choice.under_compile else ' (' + choice.reason + ')'}"
            )
    if example_inputs is not None:
        _check_model(model, example_inputs, list(zip(groups.values(), choices)), margin,
                     backend, say)  # fmt: skip
    return choices


def _check_model(model, example_inputs, pairs, margin, backend, say) -> None:
    """The whole compiled model with the kept kernels against it with every kernel aside; while
    not faster by `margin`, the kept kernel with the least GPU gain (over all its sites) steps
    aside."""
    kept = [(group, choice) for group, choice in pairs if choice.under_compile]
    if not kept:
        return
    args, kwargs = split_inputs(example_inputs)
    device = model_device(model, args, kwargs)

    def compiled_ms() -> float:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
        try:
            with torch.no_grad():
                compiled(*args, **kwargs)
                return time_call(lambda: compiled(*args, **kwargs), device)
        finally:
            torch._dynamo.reset()

    def place(group, under_compile: bool) -> None:
        for swap in group:
            swap.under_compile = under_compile

    for group, _ in kept:
        place(group, False)
    aside_ms = compiled_ms()
    for group, _ in kept:
        place(group, True)
    while kept:
        with_ms = compiled_ms()
        if with_ms * margin < aside_ms:
            return
        group, choice = min(kept, key=lambda gc: _gain_ms(gc[1]))
        kept.remove((group, choice))
        place(group, False)
        choice.under_compile = False
        choice.reason = (
            f"the compiled model took {with_ms:.4g} ms with it and {aside_ms:.4g} ms with "
            "every kernel aside"
        )
        if say is not None:
            say(f"cudaforge: {choice.name}: steps aside under torch.compile ({choice.reason})")


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


def _gain_ms(choice: CompileChoice) -> float:
    """GPU ms a kept kernel saves per forward under compile: per call, times its sites."""
    return ((choice.compiled_ms or 0.0) - choice.kernel_ms) * choice.sites


def _inputs_like(specs) -> list[torch.Tensor]:
    """Random tensors of the verified shapes, dtypes, devices and strides (swap_checks.random_like
    on zeroed templates: integers come out zero, as no observed range is left)."""
    templates = [
        torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=s.device).zero_()
        for s in specs
    ]
    return random_like(templates, seed=0)


__all__ = ["CompileChoice", "choose_under_compile"]
