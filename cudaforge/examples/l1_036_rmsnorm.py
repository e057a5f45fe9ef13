# Hand-written reference kernel for KernelBench level 1 problem 36 (RMSNorm over dim 1 of
# (batch, features, d1, d2)), cudaforge.compile style: one thread per (batch, d1, d2) position
# walks the features (stride d1*d2, so neighbouring threads read neighbouring addresses).
# Used by benchmarks/evaluate.py; not tuned.
import torch

import cudaforge

KERNELS = r"""
extern "C" __global__ void rms_norm(const float* x, float* y, int features, long long plane,
                                    long long positions, float eps) {
    long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (p >= positions) return;
    long long b = p / plane, s = p % plane;
    const float* in = x + b * features * plane + s;
    float* out = y + b * features * plane + s;
    float sum = 0.f;
    for (int f = 0; f < features; f++) { float v = in[f * plane]; sum += v * v; }
    float inv = rsqrtf(sum / features + eps);
    for (int f = 0; f < features; f++) out[f * plane] = in[f * plane] * inv;
}
"""
mod = cudaforge.compile(KERNELS)


class ModelNew(torch.nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        plane = x[0, 0].numel()
        positions = x.shape[0] * plane
        mod.rms_norm(
            ((positions + 255) // 256,),
            (256,),
            (x, y, self.num_features, plane, positions, self.eps),
        )
        return y
