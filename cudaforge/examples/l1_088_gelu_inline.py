# Hand-written reference kernel for KernelBench level 1 problem 88 (minGPT's tanh GELU),
# load_inline style. Same kernel as l1_088_gelu.py.
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void gelu_tanh(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        y[i] = 0.5f * v * (1.f + tanhf(inner));
    }
}
torch::Tensor gelu_forward(torch::Tensor x) {
    x = x.contiguous();
    auto y = torch::empty_like(x);
    long long n = x.numel();
    gelu_tanh<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_source = "torch::Tensor gelu_forward(torch::Tensor x);"
ext = load_inline(
    name="bench_gelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_forward"],
    verbose=False,
)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.gelu_forward(x)
