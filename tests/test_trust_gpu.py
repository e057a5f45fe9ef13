"""The trust boundary on the GPU (issue 17): a candidate that patches the harness's checking
functions and returns zeros is reported incorrect, and a plainly wrong kernel evaluated after it
in the same pool is rejected. Run on a GPU machine with `pytest -m gpu tests/test_trust_gpu.py`.

Both fail without the protection: the patching candidate is "ok" when its outputs are judged in
its own process (test_trust.py's control), and the wrong kernel after it was "ok" in the warm
worker it had patched (issue 17, points 1 and 2)."""

from __future__ import annotations

import pytest

from cudaforge.harness.pool import WorkerPool
from cudaforge.harness.problem import Problem

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

RUNS = {"trials": 3, "timed_runs": 20, "warmup": 3}

RELU = Problem.from_source(
    """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(1024, 1024)]
def get_init_inputs():
    return []
""",
    name="relu_1024",
)

HALF_KERNEL = r'''
import torch
import cudaforge

mod = cudaforge.compile(r"""
extern "C" __global__ void relu_half(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? 0.5f * x[i] : 0.f;
}
""")

class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        mod.relu_half(((n + 255) // 256,), (256,), (x, y, n))
        return y
'''


@pytest.fixture(scope="module")
def pool():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with WorkerPool(1, timeout=60, compile_timeout=120) as p:
        yield p


def test_a_harness_patching_candidate_is_incorrect_on_the_gpu(pool):
    from test_trust import PATCHER

    r = pool.evaluate(RELU, PATCHER, **RUNS)
    assert r.status == "incorrect" and not r.correct, r.error
    assert "cuda" in r.device


def test_a_wrong_kernel_after_it_in_the_same_pool_is_rejected(pool):
    from test_trust import PATCHER

    assert pool.evaluate(RELU, PATCHER, **RUNS).status == "incorrect"
    r = pool.evaluate(RELU, HALF_KERNEL, **RUNS)
    assert r.status == "incorrect" and not r.correct, r.error
    assert r.failure is not None and "elements differ" in r.failure.message


def test_outputs_reach_the_reference_in_gpu_memory_it_lent(pool):
    """No host copy on a GPU: every judged output crossed in the reference's device area, and
    a correct kernel still passes every check there."""
    correct = HALF_KERNEL.replace("0.5f * x[i]", "x[i]")
    r = pool.evaluate(RELU, correct, **RUNS)
    assert r.status == "ok" and r.correct, r.error
    crossed = [n for n in r.notes if n.startswith("outputs judged in the reference process")]
    assert crossed, r.notes
    lent = int(crossed[0].split(": ")[1].split(" ")[0])
    assert lent >= 2 * RUNS["trials"] and ", 0 as host copies" in crossed[0], crossed[0]
