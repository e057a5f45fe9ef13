# Hand-written reference kernel for KernelBench level 1 problem 36 (RMSNorm), load_inline style.
# Same kernel as l1_036_rmsnorm.py.
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void rms_norm(const float* x, float* y, int features, long long plane,
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
torch::Tensor rms_norm_forward(torch::Tensor x, double eps) {
    x = x.contiguous();
    auto y = torch::empty_like(x);
    long long plane = x.numel() / (x.size(0) * x.size(1));
    long long positions = x.size(0) * plane;
    rms_norm<<<(positions + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                               x.size(1), plane, positions, (float)eps);
    return y;
}
"""
cpp_source = "torch::Tensor rms_norm_forward(torch::Tensor x, double eps);"
ext = load_inline(
    name="bench_rmsnorm",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rms_norm_forward"],
    verbose=False,
)


class ModelNew(torch.nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return ext.rms_norm_forward(x, self.eps)
