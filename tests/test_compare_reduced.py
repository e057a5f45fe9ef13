"""bf16/fp16 outputs are judged against an fp32 run of the reference (cudaforge/harness/compare.py
and reference.py, the rule in options.py): a kernel at least as accurate as PyTorch's bf16 op
passes even where that op's own error is large, one that silently computes in lower precision
(fp8 inputs, bf16 accumulation) fails even where the plain tolerance table would pass it. fp32
is judged as before. The swap's own check of a kernel follows the same rule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cudaforge.harness.compare import check_outputs, reduced_precision_difference
from cudaforge.harness.evaluate import run_evaluation
from cudaforge.harness.options import EvalOptions, Tolerances, make_options
from cudaforge.harness.problem import Problem
from cudaforge.model.hotspots import find_hotspots
from cudaforge.model.swap import restore, swap_in
from cudaforge.model.swap_compare import compare as swap_compare
from cudaforge.model.swap_compare import original_in_fp32


def _matmul_case(k=64, scale=0.05):
    """Small values (so atol dominates the table's check), a bf16 matmul with K terms."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(128, k, generator=g) * scale).bfloat16()
    b = (torch.randn(k, 128, generator=g) * scale).bfloat16()
    return a, b, a @ b, a.float() @ b.float()


def _bf16_accumulation(a, b):
    """What a kernel that keeps its running sum in bf16 computes."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
    for k in range(a.shape[1]):
        acc = (acc.float() + a[:, k : k + 1].float() * b[k : k + 1, :].float()).bfloat16()
    return acc


def _fp8_inputs(a, b):
    """What a kernel that rounds its inputs to fp8 (e4m3) computes."""
    a8, b8 = a.to(torch.float8_e4m3fn).float(), b.to(torch.float8_e4m3fn).float()
    return (a8 @ b8).bfloat16()


def test_lower_precision_fails_where_the_table_alone_passes():
    a, b, ref, ref32 = _matmul_case()
    options = Tolerances()
    accumulated = _bf16_accumulation(a, b)
    assert check_outputs(accumulated, ref, options) is None  # the table alone: passes
    failure = check_outputs(accumulated, ref, options, reference32=ref32)
    assert failure is not None and "less precise than PyTorch's own bfloat16" in failure.message
    assert "fp32 run of the reference" in failure.message
    found = reduced_precision_difference(_fp8_inputs(a, b), ref, ref32, options)
    assert not found.ok and "less precise" in found.message


def test_wrong_values_are_called_wrong_and_counted():
    """A bf16 output that is wrong, not imprecise (a tenth of its rows from another product),
    reads "wrong values" with the count of elements past the bound; a precision shortfall
    keeps its own wording and counts more than one element too."""
    a, b, ref, ref32 = _matmul_case()
    options = Tolerances()
    wrong = ref.clone()
    wrong[:13] = (a[:13].flip(1).float() @ b.float()).bfloat16()
    found = reduced_precision_difference(wrong, ref, ref32, options)
    assert not found.ok and found.message.startswith("wrong values: ")
    assert found.mismatches > 13 * 64 and f"{found.mismatches} of {ref.numel()}" in found.message
    imprecise = reduced_precision_difference(_bf16_accumulation(a, b), ref, ref32, options)
    assert imprecise.message.startswith("less precise") and imprecise.mismatches > 1


def test_as_accurate_as_pytorch_passes():
    a, b, ref, ref32 = _matmul_case()
    options = Tolerances()
    assert check_outputs(ref.clone(), ref, options, reference32=ref32) is None
    assert check_outputs(ref32.bfloat16(), ref, options, reference32=ref32) is None
    # another summation order, rounded once: as accurate as PyTorch's
    other = (a.float().flip(1) @ b.float().flip(0)).bfloat16()
    assert check_outputs(other, ref, options, reference32=ref32) is None


def test_more_accurate_than_pytorch_passes_where_the_table_alone_fails():
    """x - mean(x) with a large offset: eager bf16 rounds the mean to bf16 (ulp 8 near 1000)."""
    g = torch.Generator().manual_seed(1)
    x = (1000 + torch.randn(16, 256, generator=g) * 30).bfloat16()
    ref = x - x.mean(-1, keepdim=True)
    ref32 = x.float() - x.float().mean(-1, keepdim=True)
    fused = ref32.bfloat16()  # a kernel in fp32, rounded once
    options = Tolerances()
    assert check_outputs(fused, ref, options) is not None  # the table alone: fails
    assert check_outputs(fused, ref, options, reference32=ref32) is None
    wrong = fused.clone()
    wrong[3, 7] += 4.0  # one wrong element is still caught
    assert check_outputs(wrong, ref, options, reference32=ref32) is not None


def test_nan_and_fp32_outputs():
    _, _, ref, ref32 = _matmul_case()
    options = Tolerances()
    broken = ref.clone()
    broken[0, 0] = float("nan")
    failure = check_outputs(broken, ref, options, reference32=ref32)
    assert failure is not None and "NaN/Inf" in failure.message
    # fp32 outputs: the table, with or without an fp32 reference beside them
    out = ref32 + 1e-3
    assert check_outputs(out, ref32, options) is not None
    assert check_outputs(out, ref32, options, reference32=ref32) is not None
    assert check_outputs(ref32 + 1e-6, ref32, options, reference32=ref32) is None
    with pytest.raises(ValueError, match="ref_error_multiple"):
        make_options(ref_error_multiple=0.5)


MATMUL_BF16 = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [(torch.randn(64, 64) * 0.05).bfloat16(), (torch.randn(64, 64) * 0.05).bfloat16()]


def get_init_inputs():
    return []
"""

BF16_ACCUMULATING = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):  # keeps its running sum in bf16 (test fixture)
    def forward(self, a, b):
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
        for k in range(a.shape[1]):
            acc = (acc.float() + a[:, k : k + 1].float() * b[k : k + 1, :].float()).bfloat16()
        return acc
"""

FP32_ROUNDED_ONCE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):  # computes in fp32, rounds once (test fixture)
    def forward(self, a, b):
        return (a.float() @ b.float()).bfloat16()
"""


@pytest.mark.parametrize(
    "candidate, status", [(FP32_ROUNDED_ONCE, "ok"), (BF16_ACCUMULATING, "incorrect")]
)
def test_evaluation_judges_bf16_against_the_fp32_reference(candidate, status):
    options = EvalOptions(trials=2, timed_runs=2, warmup=1, input_sets=1, device="cpu")
    result = run_evaluation(Problem.from_source(MATMUL_BF16), candidate, options)
    assert result.status == status, result.error
    if status == "ok":
        assert result.tolerances["bfloat16.ref_error_multiple"] == 2.0
    else:
        assert "less precise than PyTorch's own bfloat16" in result.error
    table_only = EvalOptions(trials=2, timed_runs=2, warmup=1, input_sets=1, device="cpu",
                             fp32_reference=False)  # fmt: skip
    # the plain table passes both: it cannot tell
    assert run_evaluation(Problem.from_source(MATMUL_BF16), candidate, table_only).status == "ok"


class Centered(nn.Module):
    def forward(self, x):
        return x - x.mean(-1, keepdim=True)


class CenteredThenLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.center = Centered()
        self.fc = nn.Linear(256, 64)

    def forward(self, x):
        return self.fc(self.center(x))


CENTERED_IN_FP32 = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):  # computes in fp32, rounds once (test fixture)
    def forward(self, x):
        y = x.float()
        return (y - y.mean(-1, keepdim=True)).bfloat16()
"""


def test_swap_judges_bf16_against_the_fp32_original():
    """The swap's own check follows the same rule: a kernel more accurate than eager bf16 (whose
    rounded mean is off by up to 4 near 1000) is swapped in."""
    torch.manual_seed(0)
    model = CenteredThenLinear().bfloat16().eval()
    x = (1000 + torch.randn(8, 256) * 30).bfloat16()
    (hotspot,) = find_hotspots(model, (x,), min_share=0.0, targets=["Centered"])
    site = hotspot.sites[0]
    with torch.no_grad():
        expected = site.run_original(site.inputs)
        expected32 = original_in_fp32(site, site.inputs, expected)
    assert expected32 is not None and expected32[0].dtype == torch.float32
    fused = [(expected32[0]).bfloat16()]
    assert swap_compare(fused, expected)[1]  # the table alone refuses it
    assert not swap_compare(fused, expected, None, expected32)[1]
    swap = swap_in(site, CENTERED_IN_FP32, hotspot.problem_source, name="centered")
    try:
        assert swap.check.trials == 3
        with torch.no_grad():
            torch.testing.assert_close(model.center(x), fused[0], rtol=0, atol=0)
    finally:
        restore(model)
