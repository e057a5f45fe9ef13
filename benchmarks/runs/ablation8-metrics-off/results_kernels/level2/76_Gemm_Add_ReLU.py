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
#define B_TILE_BYTES (BN * BK * 4)
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
//  small: the exact fp32 residual x - big, passed raw; the .tf32 MMA ignores its low
//         13 mantissa bits (truncation), costing ~2^-10 of |small| <= 2^-21 of |x|.
__device__ __forceinline__ void split_tf32(uint32_t x, uint32_t& big, uint32_t& small) {
    big = (x + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(__uint_as_float(x) - __uint_as_float(big));
}

// ---------------------------------------------------------------- wgmma helpers
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// Keeps the compiler from moving accumulator accesses across the async wgmma region.
__device__ __forceinline__ void fence_frag(float (&d)[64]) {
    #pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// Shared-memory matrix descriptor, K-major, 128-byte swizzle:
//   start address >> 4 in bits [0,14), LBO = 1 (unused for swizzled K-major) in [16,30),
//   SBO = 1024 B (8-row group stride) >> 4 in [32,46), base offset 0 (1024-B aligned atoms),
//   layout type 1 = SWIZZLE_128B in bits [62,64).
// Matches the stage layout: 128-byte rows, 16-byte chunk c of row r stored at chunk c ^ (r & 7).
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t addr) {
    return (uint64_t)((addr >> 4) & 0x3FFFu)
         | ((uint64_t)1u << 16)
         | ((uint64_t)(1024u >> 4) << 32)
         | ((uint64_t)1u << 62);
}

#define P8(i) "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), \
              "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define P64 P8(0), P8(8), P8(16), P8(24), P8(32), P8(40), P8(48), P8(56)

// D[64x128] (+)= A[64x8] (registers, tf32) * B[8x128] (smem descriptor, tf32, K-major).
// scale_d == 0: D = A*B (input accumulator ignored).
__device__ __forceinline__ void wgmma_m64n128k8_tf32(float (&d)[64], const uint32_t (&a)[4],
                                                     uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred sd;\n"
        "setp.ne.b32 sd, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, "
        "%68, sd, 1, 1;\n"
        "}\n"
        : P64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)
        : "memory");
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
// Two warpgroups; warpgroup wg computes tile rows [64*wg, 64*wg+64) x all 128 columns with
// wgmma m64n128k8 (A from registers, B from swizzled smem).
// Precision: 3xTF32 (small*big + big*small + big*big) accumulated per BK tile into a fresh
// partial (scale-d = 0 on the tile's first wgmma), then folded into the main accumulator
// with round-to-nearest fp32 adds.
//   B big   = raw tile (tensor core truncates to TF32)
//   B small = exact residual x - trunc_tf32(x), stored in Blo with the same swizzled layout.
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
linear_bias_relu_tf32(const float* __restrict__ X, const float* __restrict__ W,
                      const float* __restrict__ bias, float* __restrict__ Y,
                      int M, int N, int K)
{
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
    unsigned char* smem = smem_raw + pad;                    // 1024-B aligned
    const uint32_t sbase = raw + pad;
    unsigned char* blo = smem + STAGES * STAGE_BYTES;        // 1024-B aligned, 16 KB
    const uint32_t sBlo = sbase + STAGES * STAGE_BYTES;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wg = warp >> 2;     // warpgroup: 64-row slab
    const int wq = warp & 3;      // warp within warpgroup: 16-row slab
    const int m0 = blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;

    float acc[64];
    float part[64];
    #pragma unroll
    for (int i = 0; i < 64; ++i) { acc[i] = 0.f; part[i] = 0.f; }

    const int KT = (K + BK - 1) / BK;

    // ldmatrix lane geometry for the A fragment (matches the wgmma tf32 RS A layout:
    // a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4])
    const int mat = lane >> 3;
    const int l7 = lane & 7;
    const int a_row = 64 * wg + 16 * wq + l7 + ((mat & 1) << 3);   // row & 7 == l7
    const int a_kh = mat >> 1;

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
        // tile kt visible to all; every warpgroup finished tile kt-1 (wait_group 0), so
        // stage (kt+2)%3 and Blo are free
        __syncthreads();

        const int nk = kt + STAGES - 1;
        if (nk < KT) {
            const uint32_t sA = sbase + (nk % STAGES) * STAGE_BYTES;
            load_tile(sA, sA + A_TILE_BYTES, X, W, M, N, K, m0, n0, nk * BK, tid);
        }
        cp_async_commit();

        const int cs = kt % STAGES;
        const uint32_t sA = sbase + cs * STAGE_BYTES;
        const uint32_t sB = sA + A_TILE_BYTES;

        // A fragments for the 4 k8 steps, split into big/small
        uint32_t ab[4][4], asm_[4][4];
        #pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            const uint32_t ca = (uint32_t)(((kk * 2 + a_kh) ^ l7) << 4);
            uint32_t af[4];
            ldsm_x4(sA + (uint32_t)(a_row * ROW_BYTES) + ca, af[0], af[1], af[2], af[3]);
            #pragma unroll
            for (int e = 0; e < 4; ++e) split_tf32(af[e], ab[kk][e], asm_[kk][e]);
        }

        // B small: exact residual of the truncated TF32, same (swizzled) offsets in Blo
        {
            const unsigned char* braw = smem + cs * STAGE_BYTES + A_TILE_BYTES;
            #pragma unroll
            for (int i = 0; i < (B_TILE_BYTES / 16) / NTHREADS; ++i) {
                const int off = (tid + i * NTHREADS) * 16;
                const uint4 v = *reinterpret_cast<const uint4*>(braw + off);
                uint4 lo;
                lo.x = __float_as_uint(__uint_as_float(v.x) - __uint_as_float(v.x & 0xffffe000u));
                lo.y = __float_as_uint(__uint_as_float(v.y) - __uint_as_float(v.y & 0xffffe000u));
                lo.z = __float_as_uint(__uint_as_float(v.z) - __uint_as_float(v.z & 0xffffe000u));
                lo.w = __float_as_uint(__uint_as_float(v.w) - __uint_as_float(v.w & 0xffffe000u));
                *reinterpret_cast<uint4*>(blo + off) = lo;
            }
        }
        // generic-proxy smem data (cp.async tile + Blo) -> visible to the async proxy (wgmma)
        fence_proxy_async();
        __syncthreads();

        fence_frag(part);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BK / 8; ++kk) {
            const uint64_t dr = make_desc_sw128(sB + 32u * kk);
            const uint64_t dl = make_desc_sw128(sBlo + 32u * kk);
            wgmma_m64n128k8_tf32(part, asm_[kk], dr, kk == 0 ? 0 : 1);   // small*big (fresh)
            wgmma_m64n128k8_tf32(part, ab[kk], dl, 1);                   // big*small
            wgmma_m64n128k8_tf32(part, ab[kk], dr, 1);                   // big*big
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_frag(part);

        // fold this tile's partial sums into the main accumulator (round-to-nearest adds)
        #pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += part[i];
    }
    cp_async_wait<0>();

    // fused epilogue: + bias, ReLU, store
    // acc[4j+0], acc[4j+1] -> row m0+64wg+16wq+g,   cols n0+8j+2t, +1
    // acc[4j+2], acc[4j+3] -> row m0+64wg+16wq+g+8, same cols
    const int g = lane >> 2;
    const int t = lane & 3;
    const bool n_even = (N & 1) == 0;
    const int rbase = m0 + 64 * wg + 16 * wq + g;
    #pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int col = n0 + 8 * j + 2 * t;
        const float bv0 = (col < N) ? bias[col] : 0.f;
        const float bv1 = (col + 1 < N) ? bias[col + 1] : 0.f;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = rbase + 8 * h;
            if (row < M) {
                float v0 = acc[4 * j + 2 * h] + bv0;
                float v1 = acc[4 * j + 2 * h + 1] + bv1;
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
_STAGE_BYTES = (_BM + _BN) * _BK * 4                      # 32768
_BLO_BYTES = _BN * _BK * 4                                # 16384
_SMEM_BYTES = _STAGES * _STAGE_BYTES + _BLO_BYTES + 1024  # 115712 (1 KB alignment slack)


class ModelNew(nn.Module):
    """
    GEMM (no bias) + bias add + ReLU, fused into a single 3xTF32 Hopper wgmma CUDA kernel
    (A from registers, B straight from 128B-swizzled shared memory, cvt-free big/small split).
    """
    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        # default target is sm_90a (required for wgmma)
        self._mod = cudaforge.compile(_SRC, name="linear_bias_relu_wgmma.cu")

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
