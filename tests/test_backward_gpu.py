"""A backward problem (cudaforge.model.backward) evaluated on the GPU like any problem: a bf16
tanh-GELU's backward, with a CUDA kernel compiled by cudaforge.compile as the candidate. The
reference differentiates with autograd (also inside the harness's CUDA graph capture and its fp32
run); a kernel computing the derivative in fp32 passes, one missing a term fails.

Run on a GPU machine with `pytest -m gpu tests/test_backward_gpu.py -s`."""

from __future__ import annotations

import pytest

from cudaforge.model.backward import backward_problem

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

GELU = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        inner = 0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


def get_inputs():
    return [torch.randn((4096, 1024), dtype=torch.bfloat16)]


def get_init_inputs():
    return []
"""

KERNEL = '''
import torch
import cudaforge

SOURCE = r"""
#include <cuda_bf16.h>
extern "C" __global__ void gelu_tanh_backward(const __nv_bfloat16* x, const __nv_bfloat16* g,
                                              __nv_bfloat16* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = __bfloat162float(x[i]);
    const float c = 0.7978845608028654f;
    float t = tanhf(c * (v + 0.044715f * v * v * v));
    float slope = 0.5f * (1.0f + t) SECOND_TERM;
    out[i] = __float2bfloat16(__bfloat162float(g[i]) * slope);
}
"""


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = cudaforge.compile(SOURCE)

    def forward(self, x, grad_out):
        x, grad_out = x.contiguous(), grad_out.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        self.kernels.gelu_tanh_backward((n + 255) // 256, 256, (x, grad_out, out, n))
        return (out,)
'''
RIGHT = KERNEL.replace(
    "SECOND_TERM", "+ 0.5f * v * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * v * v)"
)
WRONG = KERNEL.replace("SECOND_TERM", "")


def test_a_backward_kernel_is_verified_and_timed_on_the_gpu():
    import cudaforge

    problem = backward_problem(GELU)
    right = cudaforge.evaluate(problem, RIGHT, trials=3)
    print(f"\nright: {right.status}, {right.speedup and round(right.speedup, 2)}x, reference "
          f"{right.reference_ms} ms, candidate {right.candidate_ms} ms, timing "
          f"{ {k: right.timing.get(k) for k in ('graph', 'settled', 'note')} }")  # fmt: skip
    assert right.ok, (right.status, right.error)
    assert right.speedup is not None and right.speedup > 1.0  # one kernel against ~10 autograd ops
    wrong = cudaforge.evaluate(problem, WRONG, trials=3)
    print(f"wrong: {wrong.status}: {wrong.error.splitlines()[0] if wrong.error else ''}")
    assert wrong.status == "incorrect"
