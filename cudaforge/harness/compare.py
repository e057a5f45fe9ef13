"""The one definition of a correct output, used by the workers' evaluation and by swap alike: what
a candidate's outputs must match (type, shape, dtype, strides, device, then values within the
tolerance table of options.py), and when two tensors share memory.

Aliasing is decided by element extent: a tensor occupies the bytes from its first element to one
past its last (data_ptr() and its strides), not its whole storage. That is the memory a write
through one tensor can change in the other, so it is exactly the hazard. The whole-storage rule
would also flag disjoint views of one allocation (a parameter in a flattened buffer, a slice of a
packed qkv projection next to the output written into its own slice), which cannot affect each
other, and it says nothing more about memory the candidate really shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .options import EvalOptions, Tolerances, dtype_name, reduced_precision_bound, tolerance_of
from .results import TrialFailure


def leaves(out) -> list:
    """The values of an output, flattened (lists, tuples, dicts by key)."""
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in leaves(x)]
    if isinstance(out, dict):
        return [y for k in sorted(out, key=str) for y in leaves(out[k])]
    return [out]


def _shape_of(out) -> str:
    if isinstance(out, (list, tuple)):
        return f"a {type(out).__name__} of {len(out)}"
    return "a tensor" if hasattr(out, "shape") else f"a {type(out).__name__}"


def check_outputs(
    actual,
    expected,
    options: EvalOptions | Tolerances,
    *,
    trial: int = 0,
    seed: int | None = None,
    phase: str = "correctness",
    facts: list | None = None,
    reference32=None,
) -> TrialFailure | None:
    """None when `actual` matches `expected` (every output); else the first difference.
    `facts`: for outputs rebuilt from host copies (host_copy.py), per leaf the facts of the
    candidate's own tensor (class, device, layout, strides), read in place of the copy's.
    `reference32`: the reference's outputs from an fp32 run; a bf16/fp16 output with its fp32
    counterpart there is judged by the reduced-precision rule (options.py)."""
    import torch

    def fail(index: int, message: str, **kw) -> TrialFailure:
        where = f"trial {trial}" + (f" (seed {seed})" if seed is not None else "")
        return TrialFailure(trial=trial, output_index=index, message=f"{where}, output {index}: "
                            f"{message}", phase=phase, seed=seed, **kw)  # fmt: skip

    got, want = leaves(actual), leaves(expected)
    exact = leaves(reference32) if reference32 is not None else []
    if len(exact) != len(want):
        exact = []
    if len(got) != len(want) or isinstance(actual, (list, tuple)) != isinstance(
        expected, (list, tuple)
    ):
        return fail(0, f"returned {_shape_of(actual)} where the reference returns "
                    f"{_shape_of(expected)}")  # fmt: skip
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        if not isinstance(e, torch.Tensor):
            if isinstance(a, torch.Tensor) or not _same_value(a, e, options):
                return fail(i, f"got {a!r}, expected {e!r}")
            continue
        if not isinstance(a, torch.Tensor):
            return fail(i, f"got {type(a).__name__}, expected a tensor")
        fact = facts[i] if facts is not None and i < len(facts) else None
        if fact is not None:
            found = _facts_failure(fact, e)
            if found:
                return fail(i, found)
        elif type(a) is not type(e):
            return fail(i, f"is a {type(a).__name__}, expected a plain {type(e).__name__} "
                        "(tensor subclasses can defer or fake their values)")  # fmt: skip
        elif a.device != e.device:
            return fail(i, f"is on {a.device}, expected {e.device}")
        elif a.layout != e.layout:
            return fail(i, f"has layout {a.layout}, expected {e.layout}")
        if a.shape != e.shape:
            return fail(i, f"shape {tuple(a.shape)}, expected {tuple(e.shape)}")
        if a.dtype != e.dtype:
            return fail(i, f"dtype {a.dtype}, expected {e.dtype}")
        if fact is not None:
            found = _facts_strides_failure(fact, e)
            if found:
                return fail(i, found)
        elif not _strides_ok(a, e):
            return fail(i, f"strides {a.stride()} (contiguous: {a.is_contiguous()}), expected "
                        f"{e.stride()} or contiguous")  # fmt: skip
        e32 = exact[i] if exact else None
        if _has_fp32_counterpart(e, e32, options):
            found = reduced_precision_difference(a, e, e32, options)
            mismatch = None if found.ok else found.failure_fields()
        else:
            mismatch = compare_tensors(a, e, options)
        if mismatch is not None:
            return fail(i, mismatch.pop("message"), **mismatch)
    return None


def _facts_failure(fact: dict, e) -> str:
    """What check_outputs says of a host copy's class, device or layout that do not match `e`'s;
    "" when they do."""
    if fact.get("type") != type(e).__name__:
        return (f"is a {str(fact.get('type'))[:60]}, expected a plain {type(e).__name__} "
                "(tensor subclasses can defer or fake their values)")  # fmt: skip
    if fact.get("device") != str(e.device):
        return f"is on {str(fact.get('device'))[:40]}, expected {e.device}"
    if fact.get("layout") != str(e.layout):
        return f"has layout {str(fact.get('layout'))[:40]}, expected {e.layout}"
    return ""


def _facts_strides_failure(fact: dict, e) -> str:
    stride, contiguous = tuple(fact.get("stride") or ()), bool(fact.get("contiguous"))
    if e.numel() > 1 and not (contiguous or (not e.is_contiguous() and stride == e.stride())):
        return (f"strides {stride} (contiguous: {contiguous}), expected {e.stride()} or "
                "contiguous")  # fmt: skip
    return ""


def _same_value(a, e, options: EvalOptions | Tolerances) -> bool:
    if isinstance(e, float) and isinstance(a, (int, float)):
        if math.isnan(e):
            return math.isnan(a)
        atol, rtol, _ = tolerance_of(options, "float32")
        return abs(a - e) <= atol + rtol * abs(e)
    return type(a) is type(e) and a == e


def _strides_ok(a, e) -> bool:
    if a.numel() <= 1:
        return True
    if e.is_contiguous():
        return a.is_contiguous()
    return a.stride() == e.stride() or a.is_contiguous()


@dataclass
class TensorDifference:
    """How far one tensor's values are from the expected ones, and whether that is correct."""

    ok: bool
    total: int
    mismatches: int = 0  # elements outside atol/rtol (or unequal, for exact dtypes)
    max_abs_err: float = 0.0  # over the elements finite in both
    max_rel_err: float = 0.0  # over the elements finite in both, the expected one nonzero
    rel_l2_err: float = 0.0  # ||actual - expected|| / ||expected||, finite elements
    nonfinite: int = 0  # NaN/Inf where the expected value is finite
    worst_index: list[int] = field(default_factory=list)
    expected: float | None = None
    actual: float | None = None
    message: str = ""

    def failure_fields(self) -> dict[str, Any]:
        """The TrialFailure fields this difference fills (message included)."""
        out: dict[str, Any] = {
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "mismatches": self.mismatches,
            "total": self.total,
            "rel_l2_err": self.rel_l2_err,
        }
        if self.mismatches:
            out.update(worst_index=self.worst_index, expected=self.expected, actual=self.actual)
        out["message"] = self.message
        return out


def compare_tensors(
    actual, expected, options: EvalOptions | Tolerances, chunk: int = 1 << 26
) -> dict | None:
    """Values of two tensors of the same shape and dtype, compared on their device in chunks.
    None when they match; else the TrialFailure fields (message, errors, where)."""
    found = tensor_difference(actual, expected, options, chunk)
    return None if found.ok else found.failure_fields()


def tensor_difference(
    actual, expected, options: EvalOptions | Tolerances, chunk: int = 1 << 26
) -> TensorDifference:
    """The errors of `actual` against `expected` (same shape and dtype, same device), and whether
    they are within the tolerance for expected's dtype: every element within atol + rtol * |e|
    (exact for integer and bool dtypes), NaN/Inf only where the expected value is the same, and
    the relative L2 error within its bound."""
    import torch

    n = expected.numel()
    if n == 0:
        return TensorDifference(ok=True, total=0)
    dtype = dtype_name(expected.dtype)
    a_flat = actual.reshape(-1)
    e_flat = expected.reshape(-1)
    exact = not (expected.is_floating_point() or expected.is_complex())
    atol, rtol, norm_tol = tolerance_of(options, dtype)
    if exact:
        atol = rtol = 0.0
    work = torch.float64 if expected.dtype in (torch.float64, torch.complex128) else torch.float32
    bad_count = 0
    new_nonfinite = 0
    max_abs = 0.0
    max_rel = 0.0
    err_sq = 0.0
    ref_sq = 0.0
    worst = (-math.inf, -1)  # (score, flat index)
    for lo in range(0, n, chunk):
        a = a_flat[lo : lo + chunk]
        e = e_flat[lo : lo + chunk]
        if exact:
            bad = a != e
            count = int(bad.sum())
            if count:
                bad_count += count
                if worst[1] < 0:
                    worst = (math.inf, lo + int(bad.nonzero()[0, 0]))
            continue
        if expected.is_complex():
            a, e = torch.view_as_real(a).to(work), torch.view_as_real(e).to(work)
        else:
            a, e = a.to(work), e.to(work)
        diff = (a - e).abs()
        tol = atol + rtol * e.abs()
        e_fin, a_fin = torch.isfinite(e), torch.isfinite(a)
        same_special = (torch.isnan(a) & torch.isnan(e)) | (~e_fin & ~torch.isnan(e) & (a == e))
        # where the reference is NaN or Inf only the same value passes
        bad = (~(diff <= tol) | ~e_fin) & ~same_special
        count = int(bad.sum())
        new_nonfinite += int((e_fin & ~a_fin).sum())
        both = e_fin & a_fin
        d = torch.where(both, diff, torch.zeros_like(diff))
        max_abs = max(max_abs, float(d.max()))
        nz = both & (e != 0)
        if bool(nz.any()):
            max_rel = max(max_rel, float((d[nz] / e[nz].abs()).max()))
        err_sq += float((d * d).sum())
        ref_sq += float(torch.where(e_fin, e * e, torch.zeros_like(e)).sum())
        if count:
            bad_count += count
            score = torch.where(bad, torch.nan_to_num(diff - tol, nan=math.inf), -math.inf)
            if not a_fin.all():
                score = torch.where(bad & ~a_fin & e_fin, torch.full_like(score, math.inf), score)
            s, idx = torch.max(score, dim=0) if score.dim() else (score, 0)
            if float(s) > worst[0] or worst[1] < 0:
                worst = (float(s), lo + int(idx))
    rel_l2 = math.sqrt(err_sq) / math.sqrt(ref_sq) if ref_sq > 0 else 0.0
    found = TensorDifference(
        ok=False,
        total=n,
        mismatches=bad_count,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        rel_l2_err=rel_l2,
        nonfinite=new_nonfinite,
    )
    if bad_count == 0 and (exact or ref_sq == 0 or rel_l2 <= norm_tol):
        found.ok = True
        return found
    if bad_count:
        flat = worst[1]
        index = _unravel(flat, tuple(expected.shape)) if expected.dim() else []
        exp_v = e_flat[flat].item() if not expected.is_complex() else abs(e_flat[flat].item())
        act_v = a_flat[flat].item() if not expected.is_complex() else abs(a_flat[flat].item())
        found.worst_index, found.expected, found.actual = index, _num(exp_v), _num(act_v)
        what = "differ" if not exact else "differ (compared exactly)"
        message = (
            f"{bad_count} of {n} elements {what}; worst at {index}: expected {exp_v:.6g}, got "
            f"{act_v:.6g}; max abs err {max_abs:.3g}, max rel err {max_rel:.3g}"
        )
        if not exact:
            message += f" (atol {atol:g}, rtol {rtol:g} for {dtype})"
        if new_nonfinite:
            message += (
                f"; {new_nonfinite} NaN/Inf where the reference is finite (outputs are filled "
                "with NaN before each run: elements the candidate never wrote show up this way)"
            )
    else:
        rms = math.sqrt(ref_sq / n)
        message = (
            f"every element is within atol/rtol, but the relative L2 error is {rel_l2:.3g} > "
            f"{norm_tol:g}: the outputs are small (rms {rms:.3g}) and the candidate's are not "
            "close to them (an all-zero output looks like this)"
        )
    found.message = message
    return found


def _has_fp32_counterpart(e, e32, options) -> bool:
    import torch

    return (
        isinstance(e32, torch.Tensor)
        and reduced_precision_bound(options, e.dtype) is not None
        and e32.shape == e.shape
        and e32.dtype in (torch.float32, torch.float64)
        and e32.device == e.device
    )


# an rms error this many times the allowed one is wrong values, not a precision shortfall
GROSS = 10.0


def reduced_precision_difference(
    actual, expected, expected32, options: EvalOptions | Tolerances, chunk: int = 1 << 24
) -> TensorDifference:
    """A bf16/fp16 output judged against an fp32 run of the reference (the rule in options.py):
    its error against `expected32` at most k times the reduced-precision reference's own error
    (`expected` against `expected32`) plus a floor of f ulps at the output's scale, for the
    largest error and for the root mean square. Where either reference is NaN or Inf only the
    reduced-precision reference's value passes; NaN/Inf where both are finite fails. The errors
    reported (max_abs_err, ...) are against `expected`, as for every other dtype."""
    import torch

    multiple, floor_ulps, eps = reduced_precision_bound(options, expected.dtype)
    n = expected.numel()
    if n == 0:
        return TensorDifference(ok=True, total=0)
    a_flat, e_flat, r_flat = actual.reshape(-1), expected.reshape(-1), expected32.reshape(-1)
    sums = dict.fromkeys(("cand", "ref", "scale", "err_e", "norm_e"), 0.0)
    peaks = dict.fromkeys(("cand", "ref", "scale", "abs_e", "rel_e"), 0.0)
    special_bad = nonfinite = 0
    worst = (-1.0, -1)  # (candidate's error against fp32, flat index)
    for lo in range(0, n, chunk):
        a = a_flat[lo : lo + chunk].double()
        e = e_flat[lo : lo + chunk].double()
        r = r_flat[lo : lo + chunk].double()
        regular = torch.isfinite(r) & torch.isfinite(e)
        same_special = (torch.isnan(a) & torch.isnan(e)) | (a == e)
        special_bad += int((~regular & ~same_special).sum())
        a_fin = torch.isfinite(a)
        nonfinite += int((regular & ~a_fin).sum())
        ok = regular & a_fin
        zero = torch.zeros_like(r)
        err_c = torch.where(ok, (a - r).abs(), zero)
        err_r = torch.where(regular, (e - r).abs(), zero)
        scale = torch.where(regular, r.abs(), zero)
        diff = torch.where(ok, (a - e).abs(), zero)
        sums["cand"] += float((err_c * err_c).sum())
        sums["ref"] += float((err_r * err_r).sum())
        sums["scale"] += float((scale * scale).sum())
        sums["err_e"] += float((diff * diff).sum())
        sums["norm_e"] += float(torch.where(ok, e * e, zero).sum())
        peaks["cand"] = max(peaks["cand"], float(err_c.max()))
        peaks["ref"] = max(peaks["ref"], float(err_r.max()))
        peaks["scale"] = max(peaks["scale"], float(scale.max()))
        peaks["abs_e"] = max(peaks["abs_e"], float(diff.max()))
        nz = ok & (e != 0)
        if bool(nz.any()):
            peaks["rel_e"] = max(peaks["rel_e"], float((diff[nz] / e[nz].abs()).max()))
        top, where = torch.max(err_c, dim=0)
        if float(top) > worst[0]:
            worst = (float(top), lo + int(where))
    rms = {k: math.sqrt(sums[k] / n) for k in ("cand", "ref", "scale")}
    bound_max = multiple * peaks["ref"] + floor_ulps * eps * peaks["scale"]
    bound_rms = multiple * rms["ref"] + floor_ulps * eps * rms["scale"]
    found = TensorDifference(
        ok=False,
        total=n,
        max_abs_err=peaks["abs_e"],
        max_rel_err=peaks["rel_e"],
        rel_l2_err=math.sqrt(sums["err_e"] / sums["norm_e"]) if sums["norm_e"] > 0 else 0.0,
        nonfinite=nonfinite,
    )
    too_far = peaks["cand"] > bound_max or rms["cand"] > bound_rms
    if not (special_bad or nonfinite or too_far):
        found.ok = True
        return found
    dtype = dtype_name(expected.dtype)
    flat = max(worst[1], 0)
    beyond = 0  # elements whose error against fp32 is past the allowed largest error
    if too_far:
        for lo in range(0, n, chunk):
            a = a_flat[lo : lo + chunk].double()
            r = r_flat[lo : lo + chunk].double()
            beyond += int(((a - r).abs() > bound_max).sum())
    found.mismatches = special_bad + nonfinite + max(beyond, 1 if too_far else 0)
    found.worst_index = _unravel(flat, tuple(expected.shape)) if expected.dim() else []
    found.expected, found.actual = _num(r_flat[flat].item()), _num(a_flat[flat].item())
    if special_bad or nonfinite:
        found.message = (
            f"{special_bad + nonfinite} of {n} elements are NaN/Inf where the reference is "
            "finite, or differ from the reference's NaN/Inf"
        )
        return found
    if rms["cand"] > GROSS * bound_rms:
        found.message = (
            f"wrong values: {beyond} of {n} elements are further from an fp32 run of the "
            f"reference than PyTorch's own {dtype} result allows (max error {peaks['cand']:.3g}, "
            f"rms {rms['cand']:.3g}, relative L2 {found.rel_l2_err:.3g}; allowed max "
            f"{bound_max:.3g}, rms {bound_rms:.3g}: {multiple:g}x the {dtype} reference's own "
            f"error + {floor_ulps:g} ulp). Worst at {found.worst_index}: fp32 reference "
            f"{r_flat[flat].item():.6g}, {dtype} reference {e_flat[flat].item():.6g}, got "
            f"{a_flat[flat].item():.6g}"
        )
        return found
    found.message = (
        f"less precise than PyTorch's own {dtype} result ({beyond} of {n} elements past the "
        f"allowed largest error): its error against an fp32 run of the "
        f"reference is max {peaks['cand']:.3g}, rms {rms['cand']:.3g}, where the {dtype} "
        f"reference's own error is max {peaks['ref']:.3g}, rms {rms['ref']:.3g}; allowed "
        f"{multiple:g}x that + {floor_ulps:g} ulp at the output's scale (max {bound_max:.3g}, "
        f"rms {bound_rms:.3g}). Worst at {found.worst_index}: fp32 reference {r_flat[flat].item():.6g}, "
        f"{dtype} reference {e_flat[flat].item():.6g}, got {a_flat[flat].item():.6g} (lower-"
        f"precision inputs, accumulation or intermediates than PyTorch's {dtype} op)"
    )
    return found


def _num(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return list(reversed(out))


# ====================================================================== shared memory


def _span(t) -> tuple[int, int] | None:
    """(first byte, end byte) of the memory a tensor's elements occupy (its element extent)."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True))
    return start, start + (extent + 1) * t.element_size()


def overlap(outs: list, others: list) -> tuple[int, int] | None:
    """(i, j) of the first tensor outs[i] whose elements share bytes with others[j]; else None."""
    import torch

    spans = [
        (j, _span(o)) for j, o in enumerate(others) if isinstance(o, torch.Tensor) and o.numel()
    ]
    for i, t in enumerate(outs):
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta":
            continue
        a = _span(t)
        for j, b in spans:
            if b is not None and a[0] < b[1] and b[0] < a[1]:
                return i, j
    return None


def aliases(outs: list, inputs: list) -> tuple[int, int] | None:
    """(output index, input index) of an output that shares memory with an input; else None."""
    return overlap(outs, inputs)


def changed_input(before: list, after: list) -> int | None:
    """Index of the first tensor of `after` whose values differ from its copy in `before`."""
    import torch

    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if isinstance(b, torch.Tensor):
            if b.is_floating_point() or b.is_complex():
                same = torch.equal(b, a) or bool((torch.isnan(b) & torch.isnan(a) | (b == a)).all())
            else:
                same = torch.equal(b, a)
            if not same:
                return i
    return None


def warm_up_comparisons(device) -> None:
    """check_outputs once on tiny tensors of the usual dtypes, equal and unequal, for a worker to
    start with: CUDA loads each kernel at its first launch, and a fresh worker's first comparison
    (the graph check of the candidate's replay) took 0.18-0.25 s on the H200 against 1.5 ms for
    the next one (RESULTS.md, "Where one evaluation's time goes")."""
    import torch

    options = EvalOptions()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.linspace(-1.0, 1.0, 256, device=device).to(dtype)
        check_outputs([x], [x.clone()], options)
        check_outputs([x + 1], [x], options)
