// fa2_mma backward: FlashAttention-2 backward on tensor cores (mma.sync m16n8k16).
//
// Concatenated after fa2_mma.cu (the manifest lists both), so it uses that file's
// ldmatrix / mma / cp.async helpers. Three launches:
//   1. bwd_pre:  D = rowsum(dO * O) per query row (fp32 workspace), dQ accumulator := 0.
//   2. bwd_main: the loop order the backward needs (outer K/V, inner Q): one CTA per
//      block of 64 keys of one K/V head. P is recomputed from Q, K and the forward's LSE
//      (never stored), then per Q block of BM rows, for the 16 keys each warp owns:
//         S^T  = K Q^T                 P^T = exp2(S^T * scale log2 e - LSE log2 e)
//         dV  += P^T dO                dP^T = V dO^T
//         dS^T = P^T * (dP^T - D)      dK  += dS^T Q
//         dQ  += dS K                  (dS^T through shared memory; fp32 atomics: other
//                                       CTAs own the other keys of the same query rows)
//      A CTA walks every query head of its GQA group, so dK and dV are summed over the
//      group in registers and written once; under a causal mask it starts at the first
//      Q block that sees its keys. Keys past the sequence (or key padding) get dK = dV = 0.
//   3. bwd_post: dQ = scale * accumulator, in the input dtype.
// A fully masked row (LSE = -inf) has P = 0: its dQ row is 0 and it adds nothing to dK/dV.
// The dQ atomics make the result depend on the order CTAs finish: not bitwise
// deterministic (the manifest says so). Built with -DFA2MMA_DETERMINISTIC (the manifest's
// flavor fa2_mma_det) the adds into each Q block's rows are ordered by key block: one
// int32 count per (batch, head, 16 query rows), zeroed by bwd_pre; key block n waits
// until the count is n, adds, then moves it to n + 1. The key blocks that see a Q block
// are always 0..last (the causal start only grows with n), and block n - 1 is dispatched
// before block n (x varies fastest), so a waiting CTA only ever waits on one that runs.
// Block of bwd_main: 4 warps; BN = 64 keys; BM = 64 query rows per step at d = 64, 16 at
// d = 128 (the dK and dV accumulators hold 16 x d fp32 per warp each).
#include "fa_harness.h"

namespace fa2mma {

constexpr int kBwdWarps = 4;
constexpr int kBwdThreads = kBwdWarps * 32;
constexpr int BNB = kBwdWarps * 16;

template <int D> struct BwdTile { static constexpr int BM = D <= 64 ? 64 : 16; };

// Rows of the dS^T tile are padded by 16 bytes: conflict-free ldmatrix, 16-byte aligned rows.
template <int BM> __device__ __forceinline__ unsigned ds_off(int row, int col) {
    return (row * (BM + 8) + col) * 2;
}

template <int D, int ROWS>
__device__ __forceinline__ void load_tile_b(unsigned sbase, const char* gbase,
                                            long long row_stride_bytes, int r0, int rmax,
                                            int tid) {
    constexpr int CH = D / 8;
    constexpr int TOTAL = ROWS * CH;
    static_assert(TOTAL % kBwdThreads == 0, "tile must split evenly over the block");
#pragma unroll
    for (int it = 0; it < TOTAL / kBwdThreads; ++it) {
        const int i = it * kBwdThreads + tid;
        const int row = i / CH;
        const int ch = i % CH;
        const int grow = r0 + row;
        const bool ok = grow < rmax;
        const char* src = gbase + (long long)(ok ? grow : 0) * row_stride_bytes + ch * 16;
        cp_async16(sbase + swz<D>(row, ch), src, ok ? 16 : 0);
    }
}

// S^T-shaped product for this warp's 16 rows of A (from sA) against the BM rows of sB:
// acc[t] += A_w B^T over the head dim. (A: K or V; B: Q or dO.)
template <int D, int BM, bool BF16>
__device__ __forceinline__ void rows_x_rowsT(float (*acc)[4], unsigned sA, unsigned sB,
                                             int warp, int lane) {
    using O = Ops<BF16>;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[4];
        {
            const int r = warp * 16 + (lane & 15);
            const int ch = kk * 2 + (lane >> 4);
            ldsm_x4(sA + swz<D>(r, ch), a[0], a[1], a[2], a[3]);
        }
#pragma unroll
        for (int np = 0; np < BM / 16; ++np) {
            const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            const int ch = kk * 2 + ((lane >> 3) & 1);
            unsigned b0, b1, b2, b3;
            ldsm_x4(sB + swz<D>(r, ch), b0, b1, b2, b3);
            O::mma(acc[2 * np], a, b0, b1);
            O::mma(acc[2 * np + 1], a, b2, b3);
        }
    }
}

// acc (16 x D, this warp's keys) += Pf (16 x BM, as A fragments) * sB (BM x D rows).
template <int D, int BM, bool BF16>
__device__ __forceinline__ void frag_x_rows(float (*acc)[4], const unsigned (*pf)[4],
                                            unsigned sB, int lane) {
    using O = Ops<BF16>;
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
            const int ch = dp * 2 + (lane >> 4);
            unsigned b0, b1, b2, b3;
            ldsm_x4_t(sB + swz<D>(r, ch), b0, b1, b2, b3);
            O::mma(acc[2 * dp], pf[kk], b0, b1);
            O::mma(acc[2 * dp + 1], pf[kk], b2, b3);
        }
    }
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The deterministic build's counts: one per (batch, head, 16 query rows), zeroed here
// (bwd_pre runs before bwd_main on the same stream).
__device__ __forceinline__ void zero_counts(const FaParams& p) {
#ifdef FA2MMA_DETERMINISTIC
    const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int i = (int)(row % p.seqlen_q);
    if ((threadIdx.x & 31) == 0 && row < (long long)p.batch * p.heads * p.seqlen_q &&
        i % 16 == 0)
        ((int*)p.workspace[2])[row / p.seqlen_q * ((p.seqlen_q + 15) / 16) + i / 16] = 0;
#else
    (void)p;
#endif
}

template <int D, bool BF16>
__device__ __forceinline__ void bwd_main(const FaParams& p) {
    using O = Ops<BF16>;
    constexpr int BM = BwdTile<D>::BM;
    constexpr int MT = BM / 8;      // n8 tiles of S^T (query columns)
    constexpr int DT = D / 8;       // n8 tiles of dK / dV
    constexpr int WM = BM / 16;     // dQ step: m16 tiles of queries ...
    constexpr int WN = kBwdWarps / WM;  // ... times column groups = the 4 warps
    constexpr int DC = D / WN;      // head-dim columns of dQ per warp
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sK = smem_u32(smem);
    const unsigned sV = sK + BNB * D * 2;
    const unsigned sQ = sV + BNB * D * 2;
    const unsigned sdO = sQ + BM * D * 2;
    const unsigned sDS = sdO + BM * D * 2;
    float* sLse = (float*)(smem + 2 * BNB * D * 2 + 2 * BM * D * 2 + BNB * (BM + 8) * 2);
    float* sDel = sLse + BM;

    constexpr unsigned kSmem = 2 * BNB * D * 2 + 2 * BM * D * 2 + BNB * (BM + 8) * 2 + 2 * BM * 4;
    if (fa_dynamic_smem_bytes() < kSmem) __trap();  // the manifest asked for too little

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int q4 = lane & 3;

    const int n0 = blockIdx.x * BNB;
    const int hk = blockIdx.y;
    const int b = blockIdx.z;
    const int group = p.heads / p.kv_heads;
    const bool causal = (p.mask_kind & FA_MASK_CAUSAL) != 0;
    int klimit = p.seqlen_k;
    if ((p.mask_kind & FA_MASK_KEY_PADDING) && p.seqlens_k) klimit = min(klimit, p.seqlens_k[b]);

    const char* kg = (const char*)p.k + 2 * (b * p.k_batch_stride + hk * p.k_head_stride);
    const char* vg = (const char*)p.v + 2 * (b * p.v_batch_stride + hk * p.v_head_stride);

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int t = 0; t < DT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[t][e] = dv[t][e] = 0.f;

    // Queries that see any key of this block: i + causal_offset >= n0.
    int m_begin = 0;
    if (causal) m_begin = max(0, n0 - p.causal_offset);
    m_begin = (m_begin / BM) * BM;
    const bool any_key = n0 < klimit && m_begin < p.seqlen_q;

    if (any_key) {
        load_tile_b<D, BNB>(sK, kg, 2 * p.k_row_stride, n0, klimit, tid);
        load_tile_b<D, BNB>(sV, vg, 2 * p.v_row_stride, n0, klimit, tid);
        cp_async_commit();
        const float* Dg = (const float*)p.workspace[0];
        float* dqacc = (float*)p.workspace[1];
        for (int hh = 0; hh < group; ++hh) {
            const int h = hk * group + hh;
            const char* qg = (const char*)p.q + 2 * (b * p.q_batch_stride + h * p.q_head_stride);
            const char* dog = (const char*)p.dout + 2 * (b * p.do_batch_stride + h * p.do_head_stride);
            const long long row_base = ((long long)b * p.heads + h) * p.seqlen_q;
            for (int m0 = m_begin; m0 < p.seqlen_q; m0 += BM) {
                __syncthreads();  // everyone is done with the previous Q / dO / dS tiles
                load_tile_b<D, BM>(sQ, qg, 2 * p.q_row_stride, m0, p.seqlen_q, tid);
                load_tile_b<D, BM>(sdO, dog, 2 * p.do_row_stride, m0, p.seqlen_q, tid);
                cp_async_commit();
                for (int i = tid; i < BM; i += kBwdThreads) {
                    const int row = m0 + i;
                    float l = FA_NEG_INF, dd = 0.f;
                    if (row < p.seqlen_q) { l = p.lse[row_base + row]; dd = Dg[row_base + row]; }
                    // A fully masked row (or a row past the end): +inf makes every P zero.
                    sLse[i] = (l == FA_NEG_INF) ? __int_as_float(0x7f800000) : l * 1.4426950408889634f;
                    sDel[i] = dd;
                }
                cp_async_wait<0>();
                __syncthreads();

                // S^T = K Q^T for this warp's 16 keys.
                float s[MT][4];
#pragma unroll
                for (int t = 0; t < MT; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
                rows_x_rowsT<D, BM, BF16>(s, sK, sQ, warp, lane);
                // P^T, masked: key j visible to query i iff j < klimit and (causal) j <= i + off.
                const bool need_mask = (n0 + BNB > klimit) ||
                                       (causal && n0 + BNB - 1 > m0 + p.causal_offset);
#pragma unroll
                for (int t = 0; t < MT; ++t) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = n0 + warp * 16 + g + ((e >> 1) << 3);
                        const int qi = t * 8 + q4 * 2 + (e & 1);
                        float pv = exp2f(fmaf(s[t][e], p.scale_log2, -sLse[qi]));
                        if (need_mask && (key >= klimit ||
                                          (causal && key > m0 + qi + p.causal_offset)))
                            pv = 0.f;
                        s[t][e] = pv;
                    }
                }
                unsigned pf[BM / 16][4];
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    pf[t >> 1][(t & 1) * 2 + 0] = O::pack(s[t][0], s[t][1]);
                    pf[t >> 1][(t & 1) * 2 + 1] = O::pack(s[t][2], s[t][3]);
                }
                frag_x_rows<D, BM, BF16>(dv, pf, sdO, lane);  // dV += P^T dO

                float dp[MT][4];
#pragma unroll
                for (int t = 0; t < MT; ++t) dp[t][0] = dp[t][1] = dp[t][2] = dp[t][3] = 0.f;
                rows_x_rowsT<D, BM, BF16>(dp, sV, sdO, warp, lane);  // dP^T = V dO^T
                unsigned dsf[BM / 16][4];
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    const int qi = t * 8 + q4 * 2;
                    const float d0 = s[t][0] * (dp[t][0] - sDel[qi]);
                    const float d1 = s[t][1] * (dp[t][1] - sDel[qi + 1]);
                    const float d2 = s[t][2] * (dp[t][2] - sDel[qi]);
                    const float d3 = s[t][3] * (dp[t][3] - sDel[qi + 1]);
                    const unsigned lo = O::pack(d0, d1), hi = O::pack(d2, d3);
                    dsf[t >> 1][(t & 1) * 2 + 0] = lo;
                    dsf[t >> 1][(t & 1) * 2 + 1] = hi;
                    // dS^T[key][query] for the dQ step.
                    const int key = warp * 16 + g;
                    asm volatile("st.shared.u32 [%0], %1;" :: "r"(sDS + ds_off<BM>(key, qi)), "r"(lo));
                    asm volatile("st.shared.u32 [%0], %1;" :: "r"(sDS + ds_off<BM>(key + 8, qi)), "r"(hi));
                }
                frag_x_rows<D, BM, BF16>(dk, dsf, sQ, lane);  // dK += dS^T Q
                __syncthreads();  // the whole dS^T tile is in shared memory

                // dQ[m0 + ...] += dS K: this warp's 16 queries x DC columns, over 64 keys.
                {
                    const int wm = warp % WM;
                    const int wn = warp / WM;
                    float acc[DC / 8][4];
#pragma unroll
                    for (int t = 0; t < DC / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
#pragma unroll
                    for (int kk = 0; kk < BNB / 16; ++kk) {
                        unsigned a[4];
                        {
                            const int mi = lane >> 3;
                            const int krow = kk * 16 + (lane & 7) + ((mi >> 1) << 3);
                            const int mcol = wm * 16 + ((mi & 1) << 3);
                            ldsm_x4_t(sDS + ds_off<BM>(krow, mcol), a[0], a[1], a[2], a[3]);
                        }
#pragma unroll
                        for (int dp2 = 0; dp2 < DC / 16; ++dp2) {
                            const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                            const int ch = (wn * DC) / 8 + dp2 * 2 + (lane >> 4);
                            unsigned b0, b1, b2, b3;
                            ldsm_x4_t(sK + swz<D>(r, ch), b0, b1, b2, b3);
                            O::mma(acc[2 * dp2], a, b0, b1);
                            O::mma(acc[2 * dp2 + 1], a, b2, b3);
                        }
                    }
#ifdef FA2MMA_DETERMINISTIC
                    int* count = (int*)p.workspace[2] + row_base / p.seqlen_q *
                                 ((p.seqlen_q + 15) / 16) + m0 / 16;
                    if (tid == 0) {
                        while (ld_acquire_gpu(count) != (int)blockIdx.x) {
                        }
                    }
                    __syncthreads();
#endif
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int row = m0 + wm * 16 + g + r * 8;
                        if (row >= p.seqlen_q) continue;
                        float* dst = dqacc + (row_base + row) * D + wn * DC + q4 * 2;
#pragma unroll
                        for (int t = 0; t < DC / 8; ++t) {
                            atomicAdd(dst + t * 8, acc[t][2 * r]);
                            atomicAdd(dst + t * 8 + 1, acc[t][2 * r + 1]);
                        }
                    }
#ifdef FA2MMA_DETERMINISTIC
                    __threadfence();  // this thread's adds are done before the count moves
                    __syncthreads();
                    if (tid == 0) atomicAdd(count, 1);
#endif
                }
            }
        }
    }

    // dK (times the softmax scale) and dV of this warp's keys, summed over the group.
    char* dkg = (char*)p.dk + 2 * (b * p.dk_batch_stride + hk * p.dk_head_stride);
    char* dvg = (char*)p.dv + 2 * (b * p.dv_batch_stride + hk * p.dv_head_stride);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = n0 + warp * 16 + g + r * 8;
        if (key >= p.seqlen_k) continue;
        unsigned* krow = (unsigned*)(dkg + 2 * (long long)key * p.dk_row_stride);
        unsigned* vrow = (unsigned*)(dvg + 2 * (long long)key * p.dv_row_stride);
#pragma unroll
        for (int t = 0; t < DT; ++t) {
            krow[t * 4 + q4] = O::pack(dk[t][2 * r] * p.scale, dk[t][2 * r + 1] * p.scale);
            vrow[t * 4 + q4] = O::pack(dv[t][2 * r], dv[t][2 * r + 1]);
        }
    }
}

}  // namespace fa2mma

// fa_bwd_pre / fa_bwd_post (fa_harness.h): D and the zeroed accumulator; dQ converted.
#define FA2MMA_BWD_ENTRIES(SUF, D, BF16)                                                   \
    extern "C" __global__ void __launch_bounds__(128) fa2_mma_bwd_pre_##SUF(FaParams p) { \
        fa_bwd_pre<D, BF16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16>(p, (float*)p.workspace[0],     \
                                                           (float*)p.workspace[1]);        \
        fa2mma::zero_counts(p);                                                            \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(fa2mma::kBwdThreads)                      \
        fa2_mma_bwd_main_##SUF(FaParams p) {                                               \
        fa2mma::bwd_main<D, BF16>(p);                                                      \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(128) fa2_mma_bwd_post_##SUF(FaParams p) { \
        fa_bwd_post<D, BF16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16>(p, (const float*)p.workspace[1]); \
    }

FA2MMA_BWD_ENTRIES(fp16_d64, 64, false)
FA2MMA_BWD_ENTRIES(fp16_d128, 128, false)
FA2MMA_BWD_ENTRIES(bf16_d64, 64, true)
FA2MMA_BWD_ENTRIES(bf16_d128, 128, true)
