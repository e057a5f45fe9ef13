# Hand-written reference kernel for KernelBench level 1 problem 12 (diag(A) @ B), cudaforge.compile
# style: each row of B scaled by A[row]. Used by benchmarks/evaluate.py; not tuned.
import torch

import cudaforge

KERNELS = r"""
extern "C" __global__ void scale_rows(const float* a, const float* b, float* c, int rows, int cols) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < (long long)rows * cols) c[i] = a[i / cols] * b[i];
}
"""
mod = cudaforge.compile(KERNELS)


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        A, B = A.contiguous(), B.contiguous()
        C = torch.empty_like(B)
        rows, cols = B.shape
        mod.scale_rows((((rows * cols) + 255) // 256,), (256,), (A, B, C, rows, cols))
        return C
