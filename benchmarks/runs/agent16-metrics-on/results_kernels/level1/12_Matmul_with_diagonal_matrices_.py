import torch
import torch.nn as nn
import cudaforge

_CUDA_SRC = r"""
// C[row, :] = A[row] * B[row, :]
// 2D launch: blockDim = (bx, by), x covers columns (float4 units), y covers rows.
extern "C" __global__ void diag_mul_vec4(const float* __restrict__ A,
                                         const float4* __restrict__ B,
                                         float4* __restrict__ C,
                                         int N, int M4)
{
    const int col0       = blockIdx.x * blockDim.x + threadIdx.x;
    const int col_stride = blockDim.x * gridDim.x;
    const int row_stride = blockDim.y * gridDim.y;
    for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < N; row += row_stride) {
        const float a = __ldg(A + row);
        const float4* __restrict__ brow = B + (size_t)row * (size_t)M4;
        float4* __restrict__ crow       = C + (size_t)row * (size_t)M4;
        for (int c = col0; c < M4; c += col_stride) {
            const float4 b = __ldg(brow + c);
            float4 r;
            r.x = a * b.x;
            r.y = a * b.y;
            r.z = a * b.z;
            r.w = a * b.w;
            __stcs(crow + c, r);
        }
    }
}

extern "C" __global__ void diag_mul_scalar(const float* __restrict__ A,
                                           const float* __restrict__ B,
                                           float* __restrict__ C,
                                           int N, int M)
{
    const int col0       = blockIdx.x * blockDim.x + threadIdx.x;
    const int col_stride = blockDim.x * gridDim.x;
    const int row_stride = blockDim.y * gridDim.y;
    for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < N; row += row_stride) {
        const float a = __ldg(A + row);
        const float* __restrict__ brow = B + (size_t)row * (size_t)M;
        float* __restrict__ crow       = C + (size_t)row * (size_t)M;
        for (int c = col0; c < M; c += col_stride) {
            __stcs(crow + c, a * __ldg(brow + c));
        }
    }
}
"""

_MODULE = None


def _get_module():
    global _MODULE
    if _MODULE is None:
        _MODULE = cudaforge.compile(_CUDA_SRC)
    return _MODULE


def _launch_config(n_rows, n_cols):
    # x-dimension of the block covers columns; shrink it for narrow matrices so
    # that threads are not wasted, and stack rows in the y-dimension instead.
    bx = min(256, max(32, ((n_cols + 31) // 32) * 32))
    by = max(1, 256 // bx)
    gx = max(1, (n_cols + bx - 1) // bx)
    gy = max(1, min((n_rows + by - 1) // by, 65535))
    return (gx, gy, 1), (bx, by, 1)


class ModelNew(nn.Module):
    """
    C = diag(A) @ B computed as a row-scaling of B with a custom CUDA kernel.
    """
    def __init__(self):
        super(ModelNew, self).__init__()
        self._mod = _get_module()

    def forward(self, A, B):
        out_dtype = torch.result_type(A, B)
        A_ = A.contiguous()
        B_ = B.contiguous()
        if A_.dtype != torch.float32:
            A_ = A_.float()
        if B_.dtype != torch.float32:
            B_ = B_.float()

        N, M = B_.shape
        C = torch.empty((N, M), device=B_.device, dtype=torch.float32)
        if N == 0 or M == 0:
            return C if out_dtype == torch.float32 else C.to(out_dtype)

        if M % 4 == 0 and B_.data_ptr() % 16 == 0 and C.data_ptr() % 16 == 0:
            M4 = M // 4
            grid, block = _launch_config(N, M4)
            self._mod.diag_mul_vec4(grid, block, (A_, B_, C, N, M4))
        else:
            grid, block = _launch_config(N, M)
            self._mod.diag_mul_scalar(grid, block, (A_, B_, C, N, M))

        return C if out_dtype == torch.float32 else C.to(out_dtype)
