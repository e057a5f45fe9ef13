import torch
import torch.nn as nn
import cudaforge

_SRC = r"""
#ifndef NC
#define NC 1
#endif

// Single pass: all NC channel values of one (b, s) position are held in registers.
extern "C" __global__ void __launch_bounds__(256)
rms_cached(const float* __restrict__ x, float* __restrict__ y,
           long long S, long long total, float eps)
{
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    long long b = idx / S;
    long long s = idx - b * S;
    long long base = b * (long long)NC * S + s;
    const float* xp = x + base;
    float* yp = y + base;

    float v[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) v[c] = __ldcs(xp + (long long)c * S);

    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        float t = v[c] * v[c];
        if ((c & 3) == 0) a0 += t;
        else if ((c & 3) == 1) a1 += t;
        else if ((c & 3) == 2) a2 += t;
        else a3 += t;
    }
    float acc = (a0 + a1) + (a2 + a3);
    float inv = 1.0f / sqrtf(acc / (float)NC + eps);

#pragma unroll
    for (int c = 0; c < NC; ++c) __stcs(yp + (long long)c * S, v[c] * inv);
}

// Generic two-pass version for any channel count.
extern "C" __global__ void __launch_bounds__(256)
rms_generic(const float* __restrict__ x, float* __restrict__ y,
            int C, long long S, long long total, float eps)
{
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    long long b = idx / S;
    long long s = idx - b * S;
    long long base = b * (long long)C * S + s;
    const float* xp = x + base;
    float* yp = y + base;

    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    int c = 0;
    for (; c + 3 < C; c += 4) {
        float v0 = __ldg(xp + (long long)(c + 0) * S);
        float v1 = __ldg(xp + (long long)(c + 1) * S);
        float v2 = __ldg(xp + (long long)(c + 2) * S);
        float v3 = __ldg(xp + (long long)(c + 3) * S);
        a0 += v0 * v0; a1 += v1 * v1; a2 += v2 * v2; a3 += v3 * v3;
    }
    for (; c < C; ++c) {
        float v = __ldg(xp + (long long)c * S);
        a0 += v * v;
    }
    float acc = (a0 + a1) + (a2 + a3);
    float inv = 1.0f / sqrtf(acc / (float)C + eps);

    for (c = 0; c < C; ++c) {
        long long off = (long long)c * S;
        __stcs(yp + off, __ldcs(xp + off) * inv);
    }
}
"""

_MAX_CACHED = 128


class ModelNew(nn.Module):
    """
    RMS Normalization over dim 1 with custom CUDA kernels.
    """
    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.num_features = num_features
        self.eps = eps
        if 1 <= int(num_features) <= _MAX_CACHED:
            self._nc = int(num_features)
        else:
            self._nc = -1
        nc_def = self._nc if self._nc > 0 else 1
        self._mod = cudaforge.compile(_SRC, options=["-DNC=%d" % nc_def])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        xf = x.contiguous()
        if xf.dtype != torch.float32:
            xf = xf.float()
        y = torch.empty_like(xf)
        if xf.numel() == 0:
            return y if orig_dtype == torch.float32 else y.to(orig_dtype)

        B = xf.shape[0]
        C = xf.shape[1]
        S = xf.numel() // (B * C)
        total = B * S
        threads = 256
        blocks = (total + threads - 1) // threads
        eps = float(self.eps)

        if C == self._nc:
            self._mod.rms_cached(blocks, threads, (xf, y, S, total, eps))
        else:
            self._mod.rms_generic(blocks, threads, (xf, y, int(C), S, total, eps))

        if orig_dtype != torch.float32:
            y = y.to(orig_dtype)
        return y
