// fa2_mma: FlashAttention-2 forward on tensor cores (mma.sync m16n8k16).
//
// Loop order of the FA2 paper (outer Q block per CTA, inner K/V tiles), with:
//   - Q loaded once into registers as mma A-fragments (ldmatrix),
//   - K and V tiles double-buffered in shared memory by cp.async (tile j+1 in flight while
//     tile j is used), rows XOR-swizzled in 16-byte chunks so ldmatrix is conflict-free,
//   - S = Q K^T and O += P V on tensor cores with fp32 accumulators,
//   - online softmax in the exp2 domain (scale * log2(e) folded into one FMA), with the
//     -inf guard: a row whose running max is still -inf subtracts 0 instead, so
//     exp2(-inf - -inf) = NaN never happens and a fully masked row ends with l = 0,
//   - final O / l and LSE = ln(sum exp(scale * s)); a fully masked row gives O = 0 and
//     LSE = -inf.
// Block: 8 warps, each owning 16 query rows (BM = 128); BN = 64 keys per tile.
// Masks: none, causal (either alignment, through causal_offset), key padding.
// Only "fa_harness.h" is included: conversions and copies are inline PTX, so the file
// compiles under NVRTC without CUDA's own headers.
#include "fa_harness.h"

namespace fa2mma {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int BM = kWarps * 16;
constexpr int BN = 64;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(a) : "l"(p));
    return a;
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills (rows past the end).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1,
                                        unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1,
                                          unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

template <bool BF16> struct Ops;

template <> struct Ops<false> {
    __device__ __forceinline__ static void mma(float* c, const unsigned* a, unsigned b0,
                                               unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // lo goes to the low 16 bits (the lower column index), hi to the high 16 bits.
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

template <> struct Ops<true> {
    __device__ __forceinline__ static void mma(float* c, const unsigned* a, unsigned b0,
                                               unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

// Byte offset of 16-byte chunk `ch` of row `row` in a tile whose rows are D halves long.
// XOR with (row & 7) spreads the 8 rows an ldmatrix reads over all 32 banks.
template <int D> __device__ __forceinline__ unsigned swz(int row, int ch) {
    return row * (D * 2) + ((ch ^ (row & 7)) << 4);
}

// Copy ROWS rows (starting at global row r0, rows >= rmax zero-filled) of a (row, D) tile.
template <int D, int ROWS>
__device__ __forceinline__ void load_tile(unsigned sbase, const char* gbase,
                                          long long row_stride_bytes, int r0, int rmax,
                                          int tid) {
    constexpr int CH = D / 8;
    constexpr int TOTAL = ROWS * CH;
    static_assert(TOTAL % kThreads == 0, "tile must split evenly over the block");
#pragma unroll
    for (int it = 0; it < TOTAL / kThreads; ++it) {
        const int i = it * kThreads + tid;
        const int row = i / CH;
        const int ch = i % CH;
        const int grow = r0 + row;
        const bool ok = grow < rmax;
        const char* src = gbase + (long long)(ok ? grow : 0) * row_stride_bytes + ch * 16;
        cp_async16(sbase + swz<D>(row, ch), src, ok ? 16 : 0);
    }
}

template <int D, bool BF16>
__device__ __forceinline__ void fwd(const FaParams& p) {
    using O = Ops<BF16>;
    constexpr int KD = D / 16;   // k-steps of S = Q K^T
    constexpr int NT = BN / 8;   // n8 tiles of S
    constexpr int DT = D / 8;    // n8 tiles of O
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sQ = smem_u32(smem);
    const unsigned sK0 = sQ + BM * D * 2;
    const unsigned sV0 = sK0 + 2 * BN * D * 2;
    constexpr unsigned KV_STAGE = BN * D * 2;

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;  // row within the 8-row group of an mma fragment
    const int q4 = lane & 3;  // column pair within the fragment

    // Longest CTAs first under a causal mask (they own the most K/V tiles).
    const int qblock = (p.mask_kind & FA_MASK_CAUSAL) ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int hk = h / (p.heads / p.kv_heads);
    const int q0 = qblock * BM;
    if (q0 >= p.seqlen_q) return;
    const int q_last = min(q0 + BM, p.seqlen_q) - 1;

    const bool causal = (p.mask_kind & FA_MASK_CAUSAL) != 0;
    int klimit = p.seqlen_k;
    if ((p.mask_kind & FA_MASK_KEY_PADDING) && p.seqlens_k) klimit = min(klimit, p.seqlens_k[b]);
    int kend = klimit;
    if (causal) kend = min(kend, q_last + p.causal_offset + 1);
    const int n_tiles = kend > 0 ? (kend + BN - 1) / BN : 0;
    // Tiles that start at or after this key need the per-element mask.
    int unmasked_end = klimit;
    if (causal) unmasked_end = min(unmasked_end, q0 + p.causal_offset + 1);

    const char* qg = (const char*)p.q + 2 * (b * p.q_batch_stride + h * p.q_head_stride);
    const char* kg = (const char*)p.k + 2 * (b * p.k_batch_stride + hk * p.k_head_stride);
    const char* vg = (const char*)p.v + 2 * (b * p.v_batch_stride + hk * p.v_head_stride);
    char* og = (char*)p.o + 2 * (b * p.o_batch_stride + h * p.o_head_stride);
    float* lseg = p.lse ? p.lse + ((long long)b * p.heads + h) * p.seqlen_q : nullptr;

    const int row0 = q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8

    float acc_o[DT][4];
#pragma unroll
    for (int t = 0; t < DT; ++t) acc_o[t][0] = acc_o[t][1] = acc_o[t][2] = acc_o[t][3] = 0.f;
    float m_run[2] = {neg_inf(), neg_inf()};
    float l_run[2] = {0.f, 0.f};

    if (n_tiles > 0) {
        load_tile<D, BM>(sQ, qg, 2 * p.q_row_stride, q0, p.seqlen_q, tid);
        load_tile<D, BN>(sK0, kg, 2 * p.k_row_stride, 0, kend, tid);
        cp_async_commit();
        load_tile<D, BN>(sV0, vg, 2 * p.v_row_stride, 0, kend, tid);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        unsigned qf[KD][4];
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            const int r = warp * 16 + (lane & 15);
            const int ch = kk * 2 + (lane >> 4);
            ldsm_x4(sQ + swz<D>(r, ch), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
        }

        for (int j = 0; j < n_tiles; ++j) {
            const int cur = j & 1;
            const unsigned sK = sK0 + cur * KV_STAGE;
            const unsigned sV = sV0 + cur * KV_STAGE;
            const int n0 = j * BN;
            cp_async_wait<1>();
            __syncthreads();  // K_j visible to all; everyone is done with tile j-1

            float s[NT][4];
#pragma unroll
            for (int t = 0; t < NT; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
                for (int np = 0; np < BN / 16; ++np) {
                    const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                    const int ch = kk * 2 + ((lane >> 3) & 1);
                    unsigned b0, b1, b2, b3;
                    ldsm_x4(sK + swz<D>(r, ch), b0, b1, b2, b3);
                    O::mma(s[2 * np], qf[kk], b0, b1);
                    O::mma(s[2 * np + 1], qf[kk], b2, b3);
                }
            }

            // Prefetch K_{j+1} into the other stage (always commit, so group counts match).
            if (j + 1 < n_tiles)
                load_tile<D, BN>(sK0 + (cur ^ 1) * KV_STAGE, kg, 2 * p.k_row_stride,
                                 n0 + BN, kend, tid);
            cp_async_commit();

            // Mask only the tiles that reach past the first row's visible range.
            if (n0 + BN > unmasked_end) {
#pragma unroll
                for (int t = 0; t < NT; ++t) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = row0 + ((e >> 1) << 3);
                        const int key = n0 + t * 8 + q4 * 2 + (e & 1);
                        int row_end = klimit;
                        if (causal) row_end = min(row_end, row + p.causal_offset + 1);
                        if (key >= row_end) s[t][e] = neg_inf();
                    }
                }
            }

            // Online softmax, exp2 domain. Row r of this thread: e in {0,1} -> row0, {2,3} -> row0+8.
            float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                mx[0] = fmaxf(mx[0], fmaxf(s[t][0], s[t][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[t][2], s[t][3]));
            }
            float m_use[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float m_new = fmaxf(m_run[r], mx[r] * p.scale_log2);
                // -inf guard: nothing visible yet in this row -> subtract 0, so every
                // exp2 below is exp2(-inf) = 0 instead of exp2(-inf - -inf) = NaN.
                m_use[r] = (m_new == neg_inf()) ? 0.f : m_new;
                const float alpha = exp2f(m_run[r] - m_use[r]);
                m_run[r] = m_new;
                l_run[r] *= alpha;
#pragma unroll
                for (int t = 0; t < DT; ++t) {
                    acc_o[t][2 * r] *= alpha;
                    acc_o[t][2 * r + 1] *= alpha;
                }
            }
            unsigned pf[BN / 16][4];
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float p0 = exp2f(fmaf(s[t][0], p.scale_log2, -m_use[0]));
                const float p1 = exp2f(fmaf(s[t][1], p.scale_log2, -m_use[0]));
                const float p2 = exp2f(fmaf(s[t][2], p.scale_log2, -m_use[1]));
                const float p3 = exp2f(fmaf(s[t][3], p.scale_log2, -m_use[1]));
                l_run[0] += p0 + p1;
                l_run[1] += p2 + p3;
                // A fragment of P for k-step t/2: tiles 2kk (a0, a1) and 2kk+1 (a2, a3).
                pf[t >> 1][(t & 1) * 2 + 0] = O::pack(p0, p1);
                pf[t >> 1][(t & 1) * 2 + 1] = O::pack(p2, p3);
            }

            cp_async_wait<1>();
            __syncthreads();  // V_j visible to all

#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                    const int ch = dp * 2 + (lane >> 4);
                    unsigned b0, b1, b2, b3;
                    ldsm_x4_t(sV + swz<D>(r, ch), b0, b1, b2, b3);
                    O::mma(acc_o[2 * dp], pf[kk], b0, b1);
                    O::mma(acc_o[2 * dp + 1], pf[kk], b2, b3);
                }
            }

            if (j + 1 < n_tiles)
                load_tile<D, BN>(sV0 + (cur ^ 1) * KV_STAGE, vg, 2 * p.v_row_stride,
                                 n0 + BN, kend, tid);
            cp_async_commit();
        }
        cp_async_wait<0>();
    }

    // Row sums were kept per thread; the four threads of a quad hold one row together.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + r * 8;
        if (row >= p.seqlen_q) continue;
        const float inv = l_run[r] > 0.f ? 1.f / l_run[r] : 0.f;
        unsigned* orow = (unsigned*)(og + 2 * (long long)row * p.o_row_stride);
#pragma unroll
        for (int t = 0; t < DT; ++t)
            orow[t * 4 + q4] = O::pack(acc_o[t][2 * r] * inv, acc_o[t][2 * r + 1] * inv);
        if (lseg && q4 == 0)
            lseg[row] = l_run[r] > 0.f ? m_run[r] * 0.69314718055994531f + logf(l_run[r])
                                       : neg_inf();
    }
}

}  // namespace fa2mma

#define FA2MMA_ENTRY(NAME, D, BF16)                                                  \
    extern "C" __global__ void __launch_bounds__(fa2mma::kThreads, 1) NAME(FaParams p) { \
        fa2mma::fwd<D, BF16>(p);                                                     \
    }

FA2MMA_ENTRY(fa2_mma_fwd_fp16_d64, 64, false)
FA2MMA_ENTRY(fa2_mma_fwd_fp16_d128, 128, false)
FA2MMA_ENTRY(fa2_mma_fwd_bf16_d64, 64, true)
FA2MMA_ENTRY(fa2_mma_fwd_bf16_d128, 128, true)
