import math
import torch
import torch.nn as nn
import cudaforge

_BX = 32
_BY = 8
_CPT = 4                     # columns per thread
_BC = _BX * _CPT             # columns per block (128)
_TARGET_BLOCKS = 132 * 16

_SRC = r"""
#define BX 32
#define BY 8
#define CPT 4
#define BC (BX * CPT)

// x viewed as [outer, R, inner]; y is [outer, inner]. Reduce over R.
// Each block covers a 128-column strip; thread tx owns columns tx, tx+32, tx+64, tx+96.
extern "C" __global__ void __launch_bounds__(BX * BY)
sum_mid_kernel(const float* __restrict__ x, float* __restrict__ y,
               long long outer, long long R, long long inner, long long rchunk)
{
    __shared__ float part[BY][BC];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const long long cbase = (long long)blockIdx.x * BC;
    const long long col0 = cbase + tx;
    const bool valid0 = col0 < inner;

    // Column offsets; an out-of-range column re-reads column col0 (valid, same L1 line)
    // and its partial sum is never stored.
    int coff[CPT];
    #pragma unroll
    for (int k = 0; k < CPT; ++k) coff[k] = (col0 + k * BX < inner) ? k * BX : 0;

    const long long r_begin = (long long)blockIdx.z * rchunk;
    long long r_end = r_begin + rchunk;
    if (r_end > R) r_end = R;
    const long long r0 = r_begin + ty;
    const long long n = (r0 < r_end) ? (r_end - r0 + BY - 1) / BY : 0;   // rows for this thread
    const long long step = (long long)BY * inner;

    for (long long o = blockIdx.y; o < outer; o += gridDim.y) {
        float acc[CPT];
        #pragma unroll
        for (int k = 0; k < CPT; ++k) acc[k] = 0.f;

        if (valid0 && n > 0) {
            const float* p = x + (o * R + r0) * inner + col0;
            long long i = 0;
            for (; i + 4 <= n; i += 4) {
                float v[4][CPT];
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float* q = p + j * step;
                    #pragma unroll
                    for (int k = 0; k < CPT; ++k) v[j][k] = __ldg(q + coff[k]);
                }
                #pragma unroll
                for (int k = 0; k < CPT; ++k)
                    acc[k] += (v[0][k] + v[1][k]) + (v[2][k] + v[3][k]);
                p += 4 * step;
            }
            for (; i < n; ++i) {
                #pragma unroll
                for (int k = 0; k < CPT; ++k) acc[k] += __ldg(p + coff[k]);
                p += step;
            }
        }
        #pragma unroll
        for (int k = 0; k < CPT; ++k) part[ty][k * BX + tx] = acc[k];
        __syncthreads();
        if (ty < CPT) {
            const int c = ty * BX + tx;
            const long long gc = cbase + c;
            if (gc < inner) {
                float s = 0.f;
                #pragma unroll
                for (int k = 0; k < BY; ++k) s += part[k][c];
                float* dst = y + o * inner + gc;
                if (gridDim.z == 1) *dst = s;
                else atomicAdd(dst, s);
            }
        }
        __syncthreads();
    }
}

// x viewed as [rows, R] (reduction over the contiguous last dim); y is [rows].
extern "C" __global__ void __launch_bounds__(256)
sum_last_kernel(const float* __restrict__ x, float* __restrict__ y,
                long long rows, long long R)
{
    __shared__ float wsum[8];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* p = x + row * R;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        long long i = tid;
        for (; i + 3 * 256 < R; i += 4 * 256) {
            const float v0 = __ldg(p + i);
            const float v1 = __ldg(p + i + 256);
            const float v2 = __ldg(p + i + 512);
            const float v3 = __ldg(p + i + 768);
            a0 += v0; a1 += v1; a2 += v2; a3 += v3;
        }
        for (; i < R; i += 256) a0 += __ldg(p + i);
        float s = (a0 + a1) + (a2 + a3);
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) wsum[warp] = s;
        __syncthreads();
        if (warp == 0) {
            float t = (lane < 8) ? wsum[lane] : 0.f;
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
            if (lane == 0) y[row] = t;
        }
        __syncthreads();
    }
}
"""

_mod = None


def _module():
    global _mod
    if _mod is None:
        _mod = cudaforge.compile(_SRC)
    return _mod


class ModelNew(nn.Module):
    """
    Sum reduction over a specified dimension (keepdim=True) with custom CUDA kernels.
    """

    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim
        self._mod = _module()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mod = self._mod
        orig_dtype = x.dtype
        out_dtype = orig_dtype if (orig_dtype.is_floating_point) else torch.int64

        if x.dim() == 0:
            xs = x.reshape(1)
            d = 0
            out_shape = ()
        else:
            xs = x
            d = self.dim % x.dim()
            out_shape = list(x.shape)
            out_shape[d] = 1

        xf = xs if xs.dtype == torch.float32 else xs.float()
        xf = xf.contiguous()
        shape = list(xf.shape)
        R = int(shape[d])
        outer = int(math.prod(shape[:d]))
        inner = int(math.prod(shape[d + 1:]))

        if outer * inner == 0:
            return torch.empty(out_shape, device=x.device, dtype=out_dtype)

        if inner == 1:
            y = torch.empty(outer, device=x.device, dtype=torch.float32)
            grid = min(outer, 65535 * 32)
            mod.sum_last_kernel(grid, 256, (xf, y, outer, R))
        else:
            gx = (inner + _BC - 1) // _BC
            gy = min(outer, 65535)
            base = gx * gy
            split = 1
            if base < _TARGET_BLOCKS and R >= 2 * _BY * 64:
                split = min((_TARGET_BLOCKS + base - 1) // base,
                            (R + _BY * 64 - 1) // (_BY * 64))
                split = max(1, min(split, 65535))
            if split > 1:
                rchunk = (R + split - 1) // split
                rchunk = ((rchunk + _BY - 1) // _BY) * _BY
                split = (R + rchunk - 1) // rchunk
            else:
                rchunk = R
            if split > 1:
                y = torch.zeros(outer * inner, device=x.device, dtype=torch.float32)
            else:
                y = torch.empty(outer * inner, device=x.device, dtype=torch.float32)
            mod.sum_mid_kernel((gx, gy, split), (_BX, _BY),
                               (xf, y, outer, R, inner, rchunk))

        y = y.view(out_shape)
        if out_dtype != torch.float32:
            y = y.to(out_dtype)
        return y
