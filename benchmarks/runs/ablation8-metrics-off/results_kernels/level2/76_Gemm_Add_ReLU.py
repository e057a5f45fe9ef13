import torch
import torch.nn as nn
import cudaforge

_SRC = r"""
#include <stdint.h>

#define BM 128
#define BN 128
#define BK 32
#define STAGES 3
#define NTHREADS 256
#define ROW_BYTES (BK * 4)
#define A_TILE_BYTES (BM * BK * 4)
#define STAGE_BYTES ((BM + BN) * BK * 4)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    uint32_t r;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n"
                 : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                        uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// 3xTF32 split without cvt: x ~= big + small.
//  big  : x with its magnitude rounded to nearest TF32 (low 13 mantissa bits cleared).
//         Integer add on the sign-magnitude encoding rounds the magnitude (ties away).
//  small: the exact fp32 residual x - big, passed raw; mma.sync .tf32 ignores its low
//         13 mantissa bits (truncation), costing ~2^-10 of |small| <= 2^-21 of |x|.
__device__ __forceinline__ void split_tf32(uint32_t x, uint32_t& big, uint32_t& small) {
    big = (x + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(__uint_as_float(x) - __uint_as_float(big));
}

__device__ __forceinline__ void mma_tf32(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Loads a BMxBK tile of X (rows m0.., cols k0..) and a BNxBK tile of W (rows n0.., cols k0..)
// into one pipeline stage. Shared layout: row r, 16-byte chunk c stored at chunk (c ^ (r & 7)).
// Requires K % 4 == 0 and 16-byte aligned X, W (each 16B chunk is fully in or out of bounds).
__device__ __forceinline__ void load_tile(uint32_t sA, uint32_t sB,
                                          const float* __restrict__ X, const float* __restrict__ W,
                                          int M, int N, int K, int m0, int n0, int k0, int tid) {
    #pragma unroll
    for (int i = 0; i < (BM * BK / 4) / NTHREADS; ++i) {
        const int idx = tid + i * NTHREADS;
        const int r = idx >> 3;
        const int ch = idx & 7;
        const int k = k0 + ch * 4;
        const uint32_t soff = (uint32_t)(r * ROW_BYTES + ((ch ^ (r & 7)) << 4));

        const int gm = m0 + r;
        const bool va = (gm < M) && (k < K);
        const float* srca = va ? (X + (size_t)gm * K + k) : X;
        cp_async16(sA + soff, srca, va ? 16 : 0);

        const int gn = n0 + r;
        const bool vb = (gn < N) && (k < K);
        const float* srcb = vb ? (W + (size_t)gn * K + k) : W;
        cp_async16(sB + soff, srcb, vb ? 16 : 0);
    }
}

// Y[M,N] = relu(X[M,K] @ W[N,K]^T + bias[N]); grid = (ceil(M/BM), ceil(N/BN)), block = 256.
// Precision: 3xTF32 (small*big + big*small + big*big) accumulated per BK tile into a fresh
// partial, then folded into the main accumulator with round-to-nearest fp32 adds.
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
linear_bias_relu_tf32(const float* __restrict__ X, const float* __restrict__ W,
                      const float* __restrict__ bias, float* __restrict__ Y,
                      int M, int N, int K)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const uint32_t sbase = smem_addr(smem_raw);

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp & 1;      // 2 warps along M (64 rows each)
    const int wn = warp >> 1;     // 4 warps along N (32 cols each)
    const int m0 = blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;

    float acc[4][4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const int KT = (K + BK - 1) / BK;

    // ldmatrix lane geometry
    const int mat = lane >> 3;
    const int l7 = lane & 7;
    const int a_row = wm * 64 + l7 + ((mat & 1) << 3);   // + mi*16 ; row & 7 == l7
    const int a_kh = mat >> 1;
    const int b_row = wn * 32 + l7 + ((mat >> 1) << 3);  // + nj*16 ; row & 7 == l7
    const int b_kh = mat & 1;

    // prologue
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) {
            const uint32_t sA = sbase + s * STAGE_BYTES;
            load_tile(sA, sA + A_TILE_BYTES, X, W, M, N, K, m0, n0, s * BK, tid);
        }
        cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();

        const int nk = kt + STAGES - 1;
        if (nk < KT) {
            const uint32_t sA = sbase + (nk % STAGES) * STAGE_BYTES;
            load_tile(sA, sA + A_TILE_BYTES, X, W, M, N, K, m0, n0, nk * BK, tid);
        }
        cp_async_commit();

        const uint32_t sA = sbase + (kt % STAGES) * STAGE_BYTES;
        const uint32_t sB = sA + A_TILE_BYTES;

        float part[4][4][4];
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            #pragma unroll
            for (int j = 0; j < 4; ++j)
                #pragma unroll
                for (int e = 0; e < 4; ++e) part[i][j][e] = 0.f;

        #pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            uint32_t af[4][4];
            uint32_t bf[4][2];
            const uint32_t ca = (uint32_t)(((kk * 2 + a_kh) ^ l7) << 4);
            const uint32_t cb = (uint32_t)(((kk * 2 + b_kh) ^ l7) << 4);

            #pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                const uint32_t addr = sA + (uint32_t)((a_row + mi * 16) * ROW_BYTES) + ca;
                ldsm_x4(addr, af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
            }
            #pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
                const uint32_t addr = sB + (uint32_t)((b_row + nj * 16) * ROW_BYTES) + cb;
                ldsm_x4(addr, bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0], bf[2 * nj + 1][1]);
            }

            uint32_t bb[4][2], bsm[4][2];
            #pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                split_tf32(bf[ni][0], bb[ni][0], bsm[ni][0]);
                split_tf32(bf[ni][1], bb[ni][1], bsm[ni][1]);
            }

            #pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                uint32_t ab[4], asm_[4];
                #pragma unroll
                for (int e = 0; e < 4; ++e) split_tf32(af[mi][e], ab[e], asm_[e]);
                #pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    mma_tf32(part[mi][ni], asm_, bb[ni][0], bb[ni][1]);    // small*big
                    mma_tf32(part[mi][ni], ab, bsm[ni][0], bsm[ni][1]);    // big*small
                    mma_tf32(part[mi][ni], ab, bb[ni][0], bb[ni][1]);      // big*big
                }
            }
        }

        // fold this tile's partial sums into the main accumulator (round-to-nearest adds)
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            #pragma unroll
            for (int j = 0; j < 4; ++j)
                #pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
    }
    cp_async_wait<0>();

    // fused epilogue: + bias, ReLU, store
    const int g = lane >> 2;
    const int t = lane & 3;
    const bool n_even = (N & 1) == 0;
    #pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
        const int col = n0 + wn * 32 + ni * 8 + 2 * t;
        const float bv0 = (col < N) ? bias[col] : 0.f;
        const float bv1 = (col + 1 < N) ? bias[col + 1] : 0.f;
        #pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + wm * 64 + mi * 16 + g + h * 8;
                if (row < M) {
                    float v0 = acc[mi][ni][2 * h] + bv0;
                    float v1 = acc[mi][ni][2 * h + 1] + bv1;
                    v0 = v0 > 0.f ? v0 : 0.f;
                    v1 = v1 > 0.f ? v1 : 0.f;
                    float* dst = Y + (size_t)row * N + col;
                    if (n_even && col + 1 < N) {
                        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
                    } else {
                        if (col < N) dst[0] = v0;
                        if (col + 1 < N) dst[1] = v1;
                    }
                }
            }
        }
    }
}

// Fallback for unaligned / K % 4 != 0 cases: plain FP32 tiled GEMM with fused bias + ReLU.
// grid = (ceil(N/16), ceil(M/16)), block = (16, 16).
extern "C" __global__ void
linear_bias_relu_simple(const float* __restrict__ X, const float* __restrict__ W,
                        const float* __restrict__ bias, float* __restrict__ Y,
                        int M, int N, int K)
{
    __shared__ float Xs[16][17];
    __shared__ float Ws[16][17];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * 16 + ty;
    const int col = blockIdx.x * 16 + tx;
    const int wrow = blockIdx.x * 16 + ty;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        const int k = k0 + tx;
        Xs[ty][tx] = (row < M && k < K) ? X[(size_t)row * K + k] : 0.f;
        Ws[ty][tx] = (wrow < N && k < K) ? W[(size_t)wrow * K + k] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 16; ++kk) acc = fmaf(Xs[ty][kk], Ws[tx][kk], acc);
        __syncthreads();
    }
    if (row < M && col < N) {
        const float v = acc + bias[col];
        Y[(size_t)row * N + col] = v > 0.f ? v : 0.f;
    }
}
"""

_BM = 128
_BN = 128
_BK = 32
_STAGES = 3
_SMEM_BYTES = _STAGES * (_BM + _BN) * _BK * 4  # 98304


class ModelNew(nn.Module):
    """
    GEMM (no bias) + bias add + ReLU, fused into a single 3xTF32 tensor-core CUDA kernel
    (cvt-free big/small split).
    """
    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self._mod = cudaforge.compile(_SRC)

    def forward(self, x):
        W = self.gemm.weight.detach()
        N, K = W.shape
        lead = x.shape[:-1]

        x2 = x.reshape(-1, K)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        x2 = x2.contiguous()
        if W.dtype != torch.float32:
            W = W.float()
        W = W.contiguous()

        b = self.bias.detach()
        if b.dtype != torch.float32:
            b = b.float()
        b = b.reshape(-1)
        if b.numel() != N:
            b = b.expand(N)
        b = b.contiguous()

        M = x2.shape[0]
        out = torch.empty((M, N), device=x.device, dtype=torch.float32)
        if M == 0 or N == 0:
            return out.reshape(*lead, N)

        aligned = (K % 4 == 0 and x2.data_ptr() % 16 == 0 and W.data_ptr() % 16 == 0)
        if aligned:
            grid = ((M + _BM - 1) // _BM, (N + _BN - 1) // _BN)
            self._mod.linear_bias_relu_tf32(grid, 256, (x2, W, b, out, M, N, K),
                                            shared_mem=_SMEM_BYTES)
        else:
            grid = ((N + 15) // 16, (M + 15) // 16)
            self._mod.linear_bias_relu_simple(grid, (16, 16), (x2, W, b, out, M, N, K))

        return out.reshape(*lead, N)
