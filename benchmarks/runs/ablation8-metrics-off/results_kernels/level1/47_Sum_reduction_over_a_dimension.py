import torch
import torch.nn as nn
import cudaforge

_SRC = r"""
#define TX 32
#define TY 8

// Reduce over the middle axis of an (outer, R, inner) tensor; inner > 1.
extern "C" __global__ void __launch_bounds__(TX * TY)
sum_cols(const float* __restrict__ x, float* __restrict__ y,
         long long R, long long inner, long long tiles)
{
    __shared__ float sm[TY][TX + 1];
    long long bid = blockIdx.x;
    long long o = bid / tiles;
    long long t = bid - o * tiles;
    int tx = threadIdx.x;
    int ty = threadIdx.y;
    long long col = t * TX + tx;

    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    float a4 = 0.f, a5 = 0.f, a6 = 0.f, a7 = 0.f;
    if (col < inner) {
        long long step = (long long)TY * inner;
        long long r = ty;
        const float* q = x + o * R * inner + r * inner + col;
        for (; r + 7 * TY < R; r += 8 * TY) {
            a0 += __ldcs(q);
            a1 += __ldcs(q + step);
            a2 += __ldcs(q + 2 * step);
            a3 += __ldcs(q + 3 * step);
            a4 += __ldcs(q + 4 * step);
            a5 += __ldcs(q + 5 * step);
            a6 += __ldcs(q + 6 * step);
            a7 += __ldcs(q + 7 * step);
            q += 8 * step;
        }
        for (; r < R; r += TY) {
            a0 += __ldcs(q);
            q += step;
        }
    }
    sm[ty][tx] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    __syncthreads();
    if (ty == 0 && col < inner) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < TY; ++i) s += sm[i][tx];
        y[o * inner + col] = s;
    }
}

// Reduce contiguous rows of length R (inner == 1): one block per row.
extern "C" __global__ void __launch_bounds__(256)
sum_rows(const float* __restrict__ x, float* __restrict__ y, long long R)
{
    __shared__ float sm[8];
    long long row = blockIdx.x;
    const float* p = x + row * R;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    long long i = threadIdx.x;
    for (; i + 3 * 256 < R; i += 4 * 256) {
        a0 += __ldcs(p + i);
        a1 += __ldcs(p + i + 256);
        a2 += __ldcs(p + i + 512);
        a3 += __ldcs(p + i + 768);
    }
    for (; i < R; i += 256) a0 += __ldcs(p + i);
    float a = (a0 + a1) + (a2 + a3);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, off);
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    if (lane == 0) sm[warp] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < 8; ++w) s += sm[w];
        y[row] = s;
    }
}
"""


class ModelNew(nn.Module):
    """
    Sum reduction over a specified dimension (keepdim=True) with custom CUDA kernels.
    """
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim
        self._mod = cudaforge.compile(_SRC)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        nd = x.dim()
        d = self.dim % nd
        xf = x.contiguous()
        if xf.dtype != torch.float32:
            xf = xf.float()

        shape = list(xf.shape)
        R = shape[d]
        outer = 1
        for s in shape[:d]:
            outer *= s
        inner = 1
        for s in shape[d + 1:]:
            inner *= s

        out_shape = list(shape)
        out_shape[d] = 1
        y = torch.empty(out_shape, dtype=torch.float32, device=xf.device)

        n_out = outer * inner
        if n_out > 0:
            if R == 0:
                y.zero_()
            elif inner == 1:
                self._mod.sum_rows(outer, 256, (xf, y, R))
            else:
                tiles = (inner + 31) // 32
                self._mod.sum_cols(outer * tiles, (32, 8), (xf, y, R, inner, tiles))

        if orig_dtype != torch.float32:
            y = y.to(orig_dtype)
        return y
