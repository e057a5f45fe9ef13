"""cudaforge.optimize on the GPU (the H200): a GPT-2 style transformer block optimized with scripted
agent replies. The kernels below are HAND-WRITTEN TEST FIXTURES (not model output): a fused causal
attention core, a fused GELU and a one-warp-per-row LayerNorm, each in a Coder reply.

Run on the GPU machine with:  python -m pytest tests/test_optimize_gpu.py -m gpu -v -s
"""

from __future__ import annotations

import re

import pytest
import torch
from test_hotspots import Block

import cudaforge
from cudaforge.agents.providers import ScriptedProvider
from cudaforge.model.store import KernelStore
from cudaforge.model.swap import stats, swaps

BATCH, CONTEXT, DIM, HEADS = 8, 128, 256, 8

# ---------------------------------------------------------------- HAND-WRITTEN FIXTURE kernels

ATTENTION_CUDA = r"""
// Causal attention core of one (batch, head) per block: K and V rows in shared memory, one warp
// per query row, lane d holding dimension d (head size 32), online softmax over the keys the
// mask keeps.
extern "C" __global__ void attention_rows(const float* __restrict__ qkv,
                                          const float* __restrict__ mask,
                                          float* __restrict__ out, int T, int H, int C,
                                          int mask_row, float scale)
{
    extern __shared__ float kv[];
    float* ks = kv;
    float* vs = kv + T * 32;
    const int b = blockIdx.y / H, h = blockIdx.y % H;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* base = qkv + (size_t)b * T * 3 * C + h * 32;
    for (int idx = threadIdx.x; idx < T * 32; idx += blockDim.x) {
        const int t = idx >> 5, d = idx & 31;
        ks[idx] = base[(size_t)t * 3 * C + C + d];
        vs[idx] = base[(size_t)t * 3 * C + 2 * C + d];
    }
    __syncthreads();
    const int i = blockIdx.x * warps + warp;
    if (i >= T) return;
    const float q = base[(size_t)i * 3 * C + lane];
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int j = 0; j < T; ++j) {
        if (mask[(size_t)i * mask_row + j] == 0.0f) continue;  // the same for the whole warp
        float s = q * ks[j * 32 + lane];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= scale;
        const float m_new = fmaxf(m, s);
        const float correction = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * correction + p;
        acc = acc * correction + p * vs[j * 32 + lane];
        m = m_new;
    }
    out[(((size_t)b * H + h) * T + i) * 32 + lane] = acc / l;
}
"""

GELU_CUDA = r"""
// GELU, tanh form, one element per thread.
extern "C" __global__ void new_gelu(const float* __restrict__ x, float* __restrict__ y, long n)
{
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
}
"""

LAYER_NORM_CUDA = r"""
// LayerNorm over the last dimension, one warp per row.
extern "C" __global__ void layer_norm_rows(const float* __restrict__ x, const float* __restrict__ w,
                                           const float* __restrict__ b, float* __restrict__ y,
                                           int rows, int C, float eps)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float* xr = x + (size_t)row * C;
    float* yr = y + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += xr[c];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float mean = sum / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) { const float d = xr[c] - mean; var += d * d; }
    for (int o = 16; o > 0; o >>= 1) var += __shfl_xor_sync(0xffffffffu, var, o);
    const float rstd = rsqrtf(var / C + eps);
    for (int c = lane; c < C; c += 32) yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
}
"""

ATTENTION = f'''
import math

import torch
import torch.nn as nn

import cudaforge

SOURCE = r"""{ATTENTION_CUDA}"""


class ModelNew(nn.Module):  # HAND-WRITTEN FIXTURE
    def __init__(self):
        super().__init__()
        self.attn_dropout = nn.Dropout(p=0.1, inplace=False).eval()
        self.register_buffer("bias", torch.tril(torch.ones(({CONTEXT}, {CONTEXT}))).view(
            1, 1, {CONTEXT}, {CONTEXT}))
        self.kernels = cudaforge.compile(SOURCE, name="attention_rows.cu")

    def forward(self, qkv):
        B, T, C3 = qkv.shape
        C, H, D, warps = C3 // 3, {HEADS}, 32, 16
        qkv = qkv.contiguous()
        out = torch.empty((B, H, T, D), device=qkv.device, dtype=qkv.dtype)
        mask = self.bias.contiguous()
        self.kernels.attention_rows(
            ((T + warps - 1) // warps, B * H), 32 * warps,
            (qkv, mask, out, T, H, C, mask.stride(2), 1.0 / math.sqrt(D)),
            shared_mem=2 * T * D * 4,
        )
        return out
'''

GELU = f'''
import torch
import torch.nn as nn

import cudaforge

SOURCE = r"""{GELU_CUDA}"""


class ModelNew(nn.Module):  # HAND-WRITTEN FIXTURE
    def __init__(self):
        super().__init__()
        self.kernels = cudaforge.compile(SOURCE, name="new_gelu.cu")

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        self.kernels.new_gelu((n + 255) // 256, 256, (x, y, n))
        return y
'''

LAYER_NORM = f'''
import torch
import torch.nn as nn

import cudaforge

SOURCE = r"""{LAYER_NORM_CUDA}"""


class ModelNew(nn.Module):  # HAND-WRITTEN FIXTURE
    def __init__(self, normalized_shape, eps, elementwise_affine, bias):
        super().__init__()
        self.layer_norm = nn.LayerNorm(
            normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias
        )
        self.kernels = cudaforge.compile(SOURCE, name="layer_norm_rows.cu")

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        C = x.shape[-1]
        rows = x.numel() // C
        self.kernels.layer_norm_rows(
            (rows + 7) // 8, 256,
            (x, self.layer_norm.weight, self.layer_norm.bias, y, rows, C,
             float(self.layer_norm.eps)),
        )
        return y
'''


def coder_reply(problem_text: str) -> str:
    """The FIXTURE Coder: a hand-written kernel for the problems it knows, no code otherwise."""
    if "softmax" in problem_text and "masked_fill" in problem_text:
        source = ATTENTION
    elif "NewGELU" in problem_text:
        source = GELU
    elif "(module): LayerNorm" in problem_text:
        source = LAYER_NORM
    else:
        return "FIXTURE reply: no kernel for this problem."
    return f"FIXTURE reply (hand-written kernel):\n\n```python\n{source.strip()}\n```\n"


def fixture_llm() -> ScriptedProvider:
    return ScriptedProvider(
        [lambda messages: coder_reply(messages[-1]["content"])] * 100, model="fixtures"
    )


def build_block():
    torch.manual_seed(0)
    model = Block(DIM, HEADS, CONTEXT).cuda().eval()
    with torch.no_grad():
        for norm in (model.ln_1, model.ln_2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.1, 0.1)
    return model, torch.randn(BATCH, CONTEXT, DIM, device="cuda")


def outcome(result, text):
    return next(h for h in result.hotspots if text in h.name)


# ---------------------------------------------------------------- CPU: the fixtures compile


def test_fixture_kernels_compile_with_nvrtc():
    """Runs anywhere NVRTC is (no GPU needed): the hand-written fixtures compile for sm_90."""
    try:
        for source, kernel in (
            (ATTENTION_CUDA, "attention_rows"),
            (GELU_CUDA, "new_gelu"),
            (LAYER_NORM_CUDA, "layer_norm_rows"),
        ):
            module = cudaforge.compile(source, arch="sm_90", cache=False)
            assert module.kernels == [kernel]
    except cudaforge.errors.LibraryNotFound as exc:
        pytest.skip(f"NVRTC is not available: {exc}")
    for source in (ATTENTION, GELU, LAYER_NORM):
        compile(source, "<fixture>", "exec")  # the Python parses
        assert re.search(r"class ModelNew\(nn\.Module\)", source)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_transformer_block_optimized_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAFORGE_CACHE_DIR", str(tmp_path / "cache"))
    model, x = build_block()
    with torch.no_grad():
        expected = model(x)
    store = KernelStore(tmp_path / "kernels.sqlite3")
    with cudaforge.WorkerPool(1) as pool:
        # min_speedup=0: every correct kernel stays in, so that what follows runs with both
        # fixtures swapped. Whether a kernel speeds the model up is judged on its end-to-end time,
        # and this 0.55 ms block is paced by the host: on the H200 at 08:28 the GELU kernel,
        # 4.33x on its own, was taken out once ("the model took 0.77 ms with it and 0.541 ms
        # before") and kept at 08:20 (1.05x). That rule is tested on the CPU (test_optimize_cpu).
        result = cudaforge.optimize(
            model, (x,), llm=fixture_llm(), rounds=1, pool=pool, store=store, min_share=0.0,
            verify_every=50, min_speedup=0,
        )  # fmt: skip
        print(result.report())
        attention, gelu = outcome(result, "softmax"), outcome(result, "NewGELU")
        for hot in (attention, gelu):  # both in: min_speedup=0
            assert hot.status == "swapped", (hot.name, hot.status, hot.detail)
            assert "cuda" in hot.worker_result["device"]  # verified on the GPU, in a worker
        # GELU is faster; the attention fixture is correct but, timed on the GPU's work with
        # the reference's launches queued ahead, 0.62-0.64x of PyTorch's kernels on the H200
        assert gelu.worker_result["speedup"] > 1 and gelu.speedup > 1
        assert result.before_ms > 0 and result.after_ms > 0 and result.speedup is not None
        assert result.after_gpu_ms is not None and 0 < result.after_gpu_ms <= 1.5 * result.after_ms
        print(f"end-to-end speedup on the H200: {result.speedup:.3f}x")
        optimized = result.model
        with torch.no_grad():
            torch.testing.assert_close(optimized(x), expected, rtol=1e-4, atol=1e-4)
        assert all(s["fallbacks"] == 0 for s in stats(optimized).values()), stats(optimized)
        assert "end-to-end on the example inputs" in result.report()
        assert "<svg" in result._repr_html_()

        # torch.compile of the optimized model runs (inductor, the kernels as custom ops)
        compiled = torch.compile(optimized)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)

        # cudaforge.graphed captures the swapped kernels in a CUDA graph and replays them
        replayed = cudaforge.graphed(optimized, (x.clone(),))
        calls = sum(s["kernel_calls"] for s in stats(optimized).values())
        with torch.no_grad():
            torch.testing.assert_close(replayed(x), expected, rtol=1e-4, atol=1e-4)
        assert replayed.replays == 1 and replayed.fallbacks == 0
        assert sum(s["kernel_calls"] for s in stats(optimized).values()) == calls  # no Python

        # load(): the stored kernels again, with no LLM, re-verified on this GPU; training=True
        def no_llm(*args, **kwargs):
            raise AssertionError("load() must not make an LLM")

        monkeypatch.setattr("cudaforge.agents.providers.get_provider", no_llm)
        monkeypatch.setattr("cudaforge.agents.loop.get_provider", no_llm)
        loaded = cudaforge.load(
            model, (x,), pool=pool, store=store, min_share=0.0, training=True, min_speedup=0
        )  # fmt: skip
    print(loaded.report())
    for text in ("softmax", "NewGELU"):
        hot = outcome(loaded, text)
        assert hot.status == "swapped" and hot.origin == "store", (hot.status, hot.detail)
        assert all(check["gradient_checked"] for check in hot.checks)
    trained = loaded.model
    assert trained is not model and swaps(model) == []

    # a training step: the same gradients as the original model's
    x_grad = x.clone().requires_grad_(True)
    x_ref = x.clone().requires_grad_(True)
    trained.zero_grad()
    model.zero_grad()
    trained(x_grad).square().mean().backward()
    model(x_ref).square().mean().backward()
    torch.testing.assert_close(x_grad.grad, x_ref.grad, rtol=1e-3, atol=1e-5)
    for (name, p), q in zip(trained.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert sum(s["kernel_calls"] for s in stats(trained).values()) > 0
