"""The checks a candidate passes in this process before it is installed: `verify` (the captured
inputs and fresh random ones), `check_gradients` (through the swapped op, against the original's
autograd) and `measure` (the original and the kernel timed in turn, ms)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import VerificationError
from ..harness.compare import aliases
from .candidate import site_device
from .hotspot_op import bypassed, gradient_leaf
from .swap_compare import compare, gradients_in_fp32, original_in_fp32, tolerances
from .swapped_hotspot import SwapCheck, SwappedHotspot
from .timing import time_call


def random_like(tensors: Sequence[Tensor], seed: int) -> list[Tensor]:
    """Fresh random tensors with the same shapes, dtypes, devices and strides."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    made = []
    for t in tensors:
        if t.is_floating_point():
            values = torch.randn(t.shape, generator=generator, dtype=torch.float32)
        elif t.dtype == torch.bool:
            values = torch.rand(t.shape, generator=generator) < 0.5
        else:
            low = int(t.min()) if t.numel() else 0
            high = int(t.max()) + 1 if t.numel() else 1
            values = torch.randint(low, max(high, low + 1), t.shape, generator=generator)
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(values.to(t.dtype))
        made.append(out)
    return made


def verify(swap: SwappedHotspot, *, trials: int = 3, tolerance: float | None = None) -> SwapCheck:
    """Check the bound candidate against the original on the captured inputs and trials - 1
    sets of fresh random ones; raises VerificationError with the first difference."""
    site = swap.site
    check = swap.check
    sets = [list(site.inputs)] + [random_like(site.inputs, seed) for seed in range(1, trials)]
    for trial, inputs in enumerate(sets):
        with torch.no_grad(), bypassed():
            expected = site.run_original(inputs)
            expected32 = original_in_fp32(site, inputs, expected)
        with torch.no_grad():
            try:
                actual = swap.run_kernel(inputs, list(site.tensors))
            except Exception as exc:
                raise VerificationError(
                    f"{swap.name}: the kernel raised on trial {trial}: {type(exc).__name__}: {exc}",
                    trial=trial,
                ) from exc
        if aliases(actual, list(inputs) + list(site.tensors)):
            raise VerificationError(f"{swap.name}: an output shares memory with an input", trial)
        worst, problem = compare(actual, expected, tolerance, expected32)
        if problem:
            raise VerificationError(
                f"{swap.name}: trial {trial}: {problem}",
                trial=trial,
                max_abs_err=worst.max_abs_err if worst else float("nan"),
                index=worst.index if worst else None,
            )
        if worst is not None and worst.index >= 0:
            check.max_abs_err = max(check.max_abs_err, worst.max_abs_err)
            check.max_rel_err = max(check.max_rel_err, worst.max_rel_err)
            check.rel_l2 = max(check.rel_l2, worst.rel_l2)
    dtype = site.output_specs[0].dtype if site.output_specs else torch.float32
    check.atol, check.rtol, _ = tolerances(dtype, tolerance)
    check.trials = len(sets)
    return check


def check_gradients(swap: SwappedHotspot, *, tolerance: float | None = None) -> SwapCheck:
    """Gradients through the swapped op (recompute, or the candidate's backward) against the
    original's autograd on the captured inputs, for random output gradients. A backward kernel
    that disagrees is not used (said in .backward_kernel_refused); a recompute that disagrees
    raises VerificationError."""
    site = swap.site
    check = swap.check
    generator = torch.Generator(device="cpu").manual_seed(1234)
    grads = [
        torch.randn(spec.shape, generator=generator).to(spec.dtype).to(spec.device)
        for spec in site.output_specs
    ]

    def leaves():
        ins = [gradient_leaf(t.detach().clone()) for t in site.inputs]
        ps = [
            gradient_leaf(t.detach().clone()) if train else t.detach().clone()
            for t, train in zip(site.tensors, swap.trainable)
        ]
        return ins, ps

    def grads_of(outputs, wanted, output_grads=grads):
        pairs = [(o, g) for o, g in zip(outputs, output_grads) if o.requires_grad]
        if not pairs:
            return [None] * len(wanted)
        return torch.autograd.grad(
            [o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True
        )

    ins, ps = leaves()
    wanted = [t for t in ins + ps if t.requires_grad]
    with torch.enable_grad(), bypassed():
        expected = grads_of(site.run_original(ins, ps), wanted)
        expected32 = gradients_in_fp32(site, ins, ps, grads, expected, grads_of)

    def through_op():
        ins2, ps2 = leaves()
        wanted2 = [t for t in ins2 + ps2 if t.requires_grad]
        with torch.enable_grad():
            outputs = torch.ops.cudaforge.hotspot(swap.handle, ins2, ps2)
            return grads_of(outputs, wanted2)

    def differs(actual) -> tuple[float, str]:
        worst = 0.0
        for i, (a, e) in enumerate(zip(actual, expected)):
            if a is None and e is None:
                continue
            a = torch.zeros_like(e) if a is None else a
            e = torch.zeros_like(a) if e is None else e
            e32 = [expected32[i]] if expected32 is not None and expected32[i] is not None else None
            diff, problem = compare([a], [e], tolerance, e32)
            if problem:
                return math.inf, f"gradient {i}: {problem}"
            worst = max(worst, diff.max_abs_err if diff else 0.0)
        return worst, ""

    if hasattr(swap.candidate, "backward") and callable(swap.candidate.backward):
        swap.use_backward_kernel = True
        try:
            worst, problem = differs(through_op())
        except Exception as exc:  # noqa: BLE001
            worst, problem = math.inf, f"{type(exc).__name__}: {exc}"
        if problem:
            swap.use_backward_kernel = False
            check.backward_kernel_refused = problem
        else:
            check.backward_kernel = True
    if not swap.use_backward_kernel:
        worst, problem = differs(through_op())
        if problem:
            raise VerificationError(f"{swap.name}: gradient check: {problem}")
    check.gradient_checked = True
    check.gradient_max_abs_err = worst
    return check


def measure(swap: SwappedHotspot, target_ms: float = 25.0) -> SwapCheck:
    """Time the original and the kernel on the captured inputs (ms, no grad), alternating the
    two so that a change of machine load hits both, two ways: queued behind a busy GPU (the
    GPU's own time, as inside a forward that keeps the GPU busy: original_ms, kernel_ms, which
    decide) and called alone on an idle GPU (launch overhead included: *_alone_ms). On the H200
    a ResNet-50 chain's kernel took 60-90 us of GPU time but 0.2-0.5 ms called alone, its
    Python forward's host work; inside the model that work overlaps the GPU's."""
    site = swap.site
    device = site_device(site)
    tensors = list(site.tensors)
    times: dict[tuple[str, bool], list[float]] = {}

    def original():
        with bypassed():
            site.run_original(site.inputs)

    def kernel():
        swap.run_kernel(site.inputs, tensors)

    with torch.no_grad():
        for _ in range(3):
            for queued in (True, False):
                for who, fn in (("original", original), ("kernel", kernel)):
                    ms = time_call(fn, device, target_ms=target_ms, queued=queued)
                    times.setdefault((who, queued), []).append(ms)
    check = swap.check
    check.original_ms, check.kernel_ms = min(times["original", True]), min(times["kernel", True])
    check.original_alone_ms = min(times["original", False])
    check.kernel_alone_ms = min(times["kernel", False])
    return check


__all__ = ["check_gradients", "measure", "random_like", "verify"]
