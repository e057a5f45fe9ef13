# Hand-written reference kernel for KernelBench level 1 problem 19 (ReLU), load_inline style
# (the form KernelBench and CudaForge candidates take). Same kernel as l1_019_relu.py.
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void relu_kernel(const float4* x, float4* y, long long n4) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        y[i] = v;
    }
}
__global__ void relu_tail(const float* x, float* y, long long start, long long n) {
    long long i = start + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
torch::Tensor relu_forward(torch::Tensor x) {
    x = x.contiguous();
    auto y = torch::empty_like(x);
    long long n = x.numel(), n4 = n / 4;
    if (n4) relu_kernel<<<(n4 + 255) / 256, 256>>>(
        reinterpret_cast<const float4*>(x.data_ptr<float>()),
        reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    if (n % 4) relu_tail<<<1, 4>>>(x.data_ptr<float>(), y.data_ptr<float>(), n4 * 4, n);
    return y;
}
"""
cpp_source = "torch::Tensor relu_forward(torch::Tensor x);"
ext = load_inline(
    name="bench_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_forward"],
    verbose=False,
)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu_forward(x)
