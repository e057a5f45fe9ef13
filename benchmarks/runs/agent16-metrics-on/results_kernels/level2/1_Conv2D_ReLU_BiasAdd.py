import torch
import torch.nn as nn
import cudaforge

_SRC = r'''
#define BM 128            // output channels per block (MMA M)
#define BN 128            // output pixels per block (MMA N)
#define BK 32             // reduction tile (Cin*KH*KW)
#define STAGES 3
#define NTHREADS 256
#define AST 36            // As[co][k]  row stride (floats) -> conflict-free A fragments
#define BST 136           // Bs[k][pix] row stride (floats) -> conflict-free B fragments
#define CST 136           // Cs[co][pix] row stride for the epilogue
#define A_FLOATS (BM * AST)
#define B_FLOATS (BK * BST)
#define STAGE_FLOATS (A_FLOATS + B_FLOATS)

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm volatile("{ .reg .u64 smem_ptr; cvta.to.shared.u64 smem_ptr, %1; cvt.u32.u64 %0, smem_ptr; }\n"
                 : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool pred) {
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool pred) {
    int n = pred ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
// Fast 3xTF32 split without cvt: v ~= hi + lo.
//  hi: magnitude rounded to nearest TF32 (round-half-away) by integer add + mask; low 13 bits zero.
//  lo: exact fp32 residual v - hi, passed raw; the .tf32 MMA ignores its low 13 mantissa bits.
__device__ __forceinline__ void split_tf32(float v, unsigned& hi, unsigned& lo) {
    const unsigned u = __float_as_uint(v);
    hi = (u + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(v - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// koff[k] = ci*H*W + kh*W + kw for k = (ci*KH + kh)*KW + kw; padded entries are 0.
extern "C" __global__ void build_koff(int* __restrict__ koff, int Kpad, int K,
                                      int KHW, int KW, int HW, int W)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= Kpad) return;
    int v = 0;
    if (k < K) {
        int ci = k / KHW;
        int r = k - ci * KHW;
        int kh = r / KW;
        int kw = r - kh * KW;
        v = ci * HW + kh * W + kw;
    }
    koff[k] = v;
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 2)
conv_relu_bias(const float* __restrict__ x, const float* __restrict__ w,
               const float* __restrict__ cbias, const float* __restrict__ bias,
               const int* __restrict__ koff, float* __restrict__ out,
               int Cin, int H, int W, int Cout, int OH, int OW, int K,
               long long Mtot, int wvec)
{
    extern __shared__ __align__(16) float smem[];
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2;     // 0..1 : 64 output channels each
    const int wn = warp & 3;      // 0..3 : 32 pixels each
    const int co0 = blockIdx.y * BM;
    const long long P = (long long)OH * OW;

    // The pixel this thread gathers (im2col) and later stores.
    const int pl = tid & (BN - 1);
    const int kr = tid >> 7;      // 0 or 1
    const long long m = (long long)blockIdx.x * BN + pl;
    const bool pvalid = m < Mtot;
    long long in_off = 0, out_off = 0;
    if (pvalid) {
        const long long n = m / P;
        const int p = (int)(m - n * P);
        const int oh = p / OW, ow = p - oh * OW;
        in_off = n * (long long)Cin * H * W + (long long)oh * W + ow;
        out_off = n * (long long)Cout * P + p;
    }
    const float* xp = x + in_off;
    const int KT = (K + BK - 1) / BK;

    auto load_tile = [&](int stage, int kt) {
        float* As = smem + stage * STAGE_FLOATS;
        float* Bs = As + A_FLOATS;
        const int k0 = kt * BK;
        // weight tile: As[co][k]
        if (wvec) {
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int idx = tid + i * NTHREADS;
                const int r = idx >> 3;
                const int c = (idx & 7) << 2;
                const int co = co0 + r;
                const int k = k0 + c;
                const bool ok = (co < Cout) && (k < K);
                const void* src = ok ? (const void*)(w + (long long)co * K + k) : (const void*)w;
                cp_async16(smem_u32(As + r * AST + c), src, ok);
            }
        } else {
            #pragma unroll 4
            for (int i = 0; i < 16; ++i) {
                const int idx = tid + i * NTHREADS;
                const int r = idx >> 5;
                const int c = idx & 31;
                const int co = co0 + r;
                const int k = k0 + c;
                const bool ok = (co < Cout) && (k < K);
                const void* src = ok ? (const void*)(w + (long long)co * K + k) : (const void*)w;
                cp_async4(smem_u32(As + r * AST + c), src, ok);
            }
        }
        // im2col tile: Bs[k][pix]
        #pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int kk = kr + 2 * i;
            const int k = k0 + kk;
            const int off = koff[k];                    // table padded to KT*BK entries
            const bool ok = pvalid && (k < K);
            const void* src = ok ? (const void*)(xp + off) : (const void*)x;
            cp_async4(smem_u32(Bs + kk * BST + pl), src, ok);
        }
    };

    float acc[4][4][4];
    #pragma unroll
    for (int a = 0; a < 4; ++a)
        #pragma unroll
        for (int b = 0; b < 4; ++b)
            #pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_tile(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int nk = kt + STAGES - 1;
        if (nk < KT) load_tile(nk % STAGES, nk);
        cp_async_commit();

        const float* As = smem + (kt % STAGES) * STAGE_FLOATS;
        const float* Bs = As + A_FLOATS;
        #pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
            unsigned bh[4][2], bl[4][2];
            #pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const float* bp = Bs + (ks + t) * BST + wn * 32 + ni * 8 + g;
                split_tf32(bp[0],       bh[ni][0], bl[ni][0]);
                split_tf32(bp[4 * BST], bh[ni][1], bl[ni][1]);
            }
            #pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                const float* ap = As + (wm * 64 + mi * 16 + g) * AST + ks + t;
                unsigned ah[4], al[4];
                split_tf32(ap[0],           ah[0], al[0]);
                split_tf32(ap[8 * AST],     ah[1], al[1]);
                split_tf32(ap[4],           ah[2], al[2]);
                split_tf32(ap[8 * AST + 4], ah[3], al[3]);
                #pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    mma_tf32(acc[mi][ni], al, bh[ni]);   // small correction terms first
                    mma_tf32(acc[mi][ni], ah, bl[ni]);
                    mma_tf32(acc[mi][ni], ah, bh[ni]);   // main term last
                }
            }
        }
    }

    cp_async_wait<0>();
    __syncthreads();

    // Stage accumulators: Cs[co][pix]
    float* Cs = smem;
    #pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        #pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            const int r = wm * 64 + mi * 16 + g;
            const int c = wn * 32 + ni * 8 + 2 * t;
            *reinterpret_cast<float2*>(Cs + r * CST + c) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
            *reinterpret_cast<float2*>(Cs + (r + 8) * CST + c) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
        }
    }
    __syncthreads();

    if (pvalid) {
        float* op = out + out_off;
        #pragma unroll 4
        for (int i = 0; i < BM / 2; ++i) {
            const int cl = kr + 2 * i;
            const int co = co0 + cl;
            if (co < Cout) {
                float v = Cs[cl * CST + pl] + cbias[co];
                v = fmaxf(v, 0.f) + bias[co];
                op[(long long)co * P] = v;
            }
        }
    }
}
'''

_BM = 128
_BN = 128
_BK = 32
_STAGES = 3
_SMEM = _STAGES * (_BM * 36 + _BK * 136) * 4   # 107520 bytes


class ModelNew(nn.Module):
    """
    Conv2d (3xTF32 tensor-core implicit GEMM, ~fp32 accuracy) + ReLU + per-channel bias, fused.
    """
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self._mod = cudaforge.compile(_SRC)
        self._koff_cache = {}

    def _koff(self, Cin, KH, KW, H, W, device):
        key = (Cin, KH, KW, H, W, str(device))
        t = self._koff_cache.get(key)
        if t is None:
            K = Cin * KH * KW
            KT = (K + _BK - 1) // _BK
            Kpad = max(KT * _BK, _BK)
            t = torch.empty(Kpad, dtype=torch.int32, device=device)
            self._mod.build_koff((Kpad + 255) // 256, 256,
                                 (t, Kpad, K, KH * KW, KW, H * W, W))
            self._koff_cache[key] = t
        return t

    def forward(self, x):
        x = x.contiguous()
        if x.dtype != torch.float32:
            x = x.float()
        w = self.conv.weight.detach().contiguous()
        Cout, Cin, KH, KW = w.shape
        if self.conv.bias is not None:
            cb = self.conv.bias.detach().contiguous()
        else:
            cb = torch.zeros(Cout, device=x.device, dtype=torch.float32)
        b = self.bias.detach().reshape(-1)
        if b.numel() == 1 and Cout != 1:
            b = b.expand(Cout)
        b = b.contiguous()

        N, _, H, W = x.shape
        OH, OW = H - KH + 1, W - KW + 1
        out = torch.empty((N, Cout, OH, OW), device=x.device, dtype=torch.float32)
        M = N * OH * OW
        K = Cin * KH * KW
        if M <= 0 or Cout == 0:
            return out

        koff = self._koff(Cin, KH, KW, H, W, x.device)
        wvec = 1 if (K % 4 == 0 and w.data_ptr() % 16 == 0) else 0
        grid = ((M + _BN - 1) // _BN, (Cout + _BM - 1) // _BM, 1)
        self._mod.conv_relu_bias(
            grid, 256,
            (x, w, cb, b, koff, out, Cin, H, W, Cout, OH, OW, K, M, wvec),
            shared_mem=_SMEM)
        return out
