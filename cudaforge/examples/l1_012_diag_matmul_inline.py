# Hand-written reference kernel for KernelBench level 1 problem 12 (diag(A) @ B), load_inline
# style. Same kernel as l1_012_diag_matmul.py.
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void scale_rows(const float* a, const float* b, float* c, int rows, int cols) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < (long long)rows * cols) c[i] = a[i / cols] * b[i];
}
torch::Tensor diag_matmul(torch::Tensor a, torch::Tensor b) {
    a = a.contiguous(); b = b.contiguous();
    auto c = torch::empty_like(b);
    int rows = b.size(0), cols = b.size(1);
    long long n = (long long)rows * cols;
    scale_rows<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                         c.data_ptr<float>(), rows, cols);
    return c;
}
"""
cpp_source = "torch::Tensor diag_matmul(torch::Tensor a, torch::Tensor b);"
ext = load_inline(
    name="bench_diag_matmul",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["diag_matmul"],
    verbose=False,
)


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        return ext.diag_matmul(A, B)
