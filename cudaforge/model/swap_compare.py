"""A swapped kernel's outputs against the original's: the tolerances and the comparison a swap
uses, thin wrappers over the harness's one definition of a correct value
(cudaforge.harness.compare, cudaforge.harness.options), and the original run in fp32 that a
bf16/fp16 output is judged against."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..harness.compare import reduced_precision_difference, tensor_difference
from ..harness.options import Tolerances, reduced_precision_bound, tolerance_of

REDUCED = (torch.bfloat16, torch.float16)  # the dtypes judged against an fp32 run


def tolerances(dtype: torch.dtype, tolerance: float | None = None) -> tuple[float, float, float]:
    """(atol, rtol, relative L2 bound) for dtype, from the harness's one tolerance table; a float
    `tolerance` sets atol = rtol (the bound then 10x it, never below the table's)."""
    return tolerance_of(Tolerances.uniform(tolerance), dtype)


@dataclass
class Difference:
    """How far one output is from the expected one."""

    index: int
    max_abs_err: float
    max_rel_err: float
    rel_l2: float
    message: str = ""


def compare(actual: Sequence[Tensor], expected: Sequence[Tensor], tolerance=None, expected32=None):
    """(worst Difference, problem or '') of outputs against the expected ones, by the harness's
    definition of a correct value (cudaforge.harness.compare): with `expected32`, the original's
    outputs from an fp32 run, a bf16/fp16 output is judged by the reduced-precision rule."""
    if len(actual) != len(expected):
        return None, f"{len(actual)} outputs, expected {len(expected)}"
    tables = Tolerances.uniform(tolerance)
    worst = Difference(-1, 0.0, 0.0, 0.0)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if not isinstance(a, Tensor):
            return None, f"output {i} is a {type(a).__name__}, not a tensor"
        if a.shape != e.shape or a.dtype != e.dtype or a.device != e.device:
            return None, (
                f"output {i} is {a.dtype}{list(a.shape)} on {a.device}, expected "
                f"{e.dtype}{list(e.shape)} on {e.device}"
            )
        e32 = expected32[i] if expected32 is not None and i < len(expected32) else None
        if (
            isinstance(e32, Tensor)
            and e32.shape == e.shape
            and reduced_precision_bound(tables, e.dtype) is not None
        ):
            found = reduced_precision_difference(a.detach(), e.detach(), e32.detach(), tables)
        else:
            found = tensor_difference(a.detach(), e.detach(), tables)
        if found.nonfinite:  # NaN or Inf where the expected value is finite
            found.max_abs_err = found.max_rel_err = found.rel_l2_err = math.inf
        if found.max_abs_err > worst.max_abs_err or worst.index < 0:
            worst = Difference(i, found.max_abs_err, found.max_rel_err, found.rel_l2_err)
        if not found.ok:
            worst = Difference(
                i, found.max_abs_err, found.max_rel_err, found.rel_l2_err, found.message
            )
            return worst, f"output {i}: {found.message}"
    return worst, ""


def original_in_fp32(site, inputs, expected, tensors=None) -> list[Tensor] | None:
    """A site's original outputs with its parameters (`tensors`, default the site's) and bf16/fp16
    inputs upcast to fp32, when some output is bf16/fp16 (the harness's reduced-precision rule
    judges against them); else None, also when the original does not run so."""
    if not any(t.dtype in REDUCED for t in expected):
        return None

    def up(t):
        return t.float() if t.dtype in REDUCED else t

    try:
        outputs = site.run_original(
            [up(t) for t in inputs], [up(t) for t in (site.tensors if tensors is None else tensors)]
        )
    except Exception:  # noqa: BLE001 - then the tolerance table alone judges
        return None
    if len(outputs) != len(expected) or any(o.shape != e.shape for o, e in zip(outputs, expected)):
        return None
    return outputs


def gradients_in_fp32(site, ins, ps, grads, expected, grads_of) -> list | None:
    """The original's gradients from an fp32 run (bf16/fp16 inputs, parameters and output
    gradients upcast), which the reduced-precision rule judges a bf16/fp16 gradient against, as
    the worker judges outputs; None where no gradient is bf16/fp16 or the original does not run
    so (the tolerance table alone judges then). grads_of(outputs, wanted, output_grads): the
    caller's autograd of the original, as it computed `expected`."""
    if not any(e is not None and e.dtype in REDUCED for e in expected):
        return None

    def up(t):
        leaf = t.detach().float() if t.dtype in REDUCED else t.detach().clone()
        return leaf.requires_grad_(t.requires_grad)

    ins32, ps32 = [up(t) for t in ins], [up(t) for t in ps]
    wanted = [t for t in ins32 + ps32 if t.requires_grad]
    try:
        found = grads_of(site.run_original(ins32, ps32), wanted,
                         [g.float() if g.dtype in REDUCED else g for g in grads])  # fmt: skip
    except Exception:  # noqa: BLE001
        return None
    if len(found) != len(expected):
        return None
    return [None if f is None or e is None or f.shape != e.shape else f
            for f, e in zip(found, expected)]  # fmt: skip


def model_in_fp32(model, args, kwargs, device):
    """A bf16/fp16 model's outputs from an fp32 copy of it on its inputs upcast, the random
    generators seeded as optimize's forward seeds them; None for a model in training mode or with
    no bf16/fp16 parameter. Raises what the copy's forward raises."""
    import copy

    from torch.utils._pytree import tree_map

    if model.training or not any(p.dtype in REDUCED for p in model.parameters()):
        return None

    def up(value):
        return value.float() if isinstance(value, Tensor) and value.dtype in REDUCED else value

    model32 = copy.deepcopy(model).float()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(0)
            return model32(*tree_map(up, args), **tree_map(up, kwargs))
    finally:
        del model32
        if device.type == "cuda":
            torch.cuda.empty_cache()


__all__ = [
    "REDUCED",
    "Difference",
    "compare",
    "gradients_in_fp32",
    "model_in_fp32",
    "original_in_fp32",
    "tolerances",
]
