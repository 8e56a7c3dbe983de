// splitkv: split-KV ("flash-decoding") forward for decoding and short query blocks, over
// the dense, varlen and paged layouts, with causal masks, key padding, boolean masks and
// sliding windows.
//
// Decoding is memory bound: one query row per head against a long K/V cache, so the
// kernel is built to keep HBM busy. The keys a CTA's rows can see are cut into `splits`
// pieces of whole 64-key chunks (the count comes from harness.candidates.split_heuristic):
//
//   splitkv_partial_*: grid = (split, kv head x row chunk, sequence). A CTA takes 16
//       query rows of one kv head (a GQA group's heads, and query positions, together)
//       and streams its piece of K/V once for all of them. Each of its 4 warps owns 16
//       keys of every 64-key chunk and runs its own pipeline: SK_STAGES slices of K and V
//       in flight by cp.async (16-byte copies, XOR-swizzled rows), S = Q K^T and
//       O += P V on tensor cores (mma.sync m16n8k16, fp32 accumulators, Q held as
//       A fragments), the online softmax in registers. No block barrier in the loop: a
//       warp waits only for its own copies. The four warps' (max, sum, O) are merged
//       once at the end. With one split it writes O and LSE; else a partial O (divided
//       by its own sum) and a partial LSE per split, and then, with SK_FUSED_COMBINE (the
//       manifest's setting), the last CTA of the row chunk to finish combines them all
//       (splitkv_combine.cu).
//   splitkv_combine_*: the same combine as a second kernel (SK_FUSED_COMBINE=0), one
//       block per query row: lse = logsumexp_s lse_s, O = sum_s exp(lse_s - lse) O_s, an
//       empty split (lse_s = -inf) or a NaN weight counting 0.
//
// Layouts (fa_harness.h, harness/core/serving.py): dense (B, H, N, d); varlen packed
// (1, H, T, d) with cu_seqlens_q/k slot starts and seqlens_q/k lengths (the padding rows
// between sequences are never written); paged: q dense, K/V page pools read through
// block_table, seqlens_k the cache lengths. A sequence's causal / window offset is
// seqlens_k - seqlens_q (0 under FA_MASK_TOP_LEFT); dense cases use causal_offset.
//
// An e4m3 KV cache (FaParams.fp8 == FA_FP8_KV: the splitkv_partial8_* entries, KV8): the
// same pipeline on one-byte slices (SK_STAGES8 of them in flight), each mma fragment of
// K or V turned into Q's dtype exactly as it is loaded, descales applied in float32
// (docs/fp8.md says how).
//
// Workspaces: [0] partial O fp32 (splits, B, H, Nq, d), [1] partial LSE fp32
// (splits, B, H, Nq), indexed by (sequence, head, query position): a varlen sequence's
// rows are < Nq (the longest), so the dense sizes hold every layout. [2] (fused combine)
// one int32 ticket counter per (sequence, kv head, row chunk), zero between calls.
#include "fa_harness.h"

namespace sk {

// KV8: the K/V cache is float8 e4m3 (FaParams.fp8 == FA_FP8_KV, Q in DT): slices of
// one byte per element go to shared memory as they are, and are turned into DT exactly
// (e4m3 fits in fp16 and bf16) as the mma fragments are loaded (kv8_frag, below); the
// descales are applied in float32 outside the products.
template <int DT, int D, bool KV8>
__device__ __forceinline__ void partial(const FaParams& p) {
    using M = Mma<DT>;
    constexpr int NS = KV8 ? NST8 : NST;    // K/V slices in flight per warp
    constexpr int ES = KV8 ? 1 : 2;         // bytes of a K/V element
    constexpr int RB = D * ES;              // bytes of a K/V row
    constexpr int KD = D / 16;              // k-steps of S = Q K^T
    constexpr int NT = D / 8;               // n8 tiles of O
    constexpr int CPR = RB / 16;            // 16-byte chunks per K/V row
    constexpr int RPU = 32 / CPR;           // rows one warp-wide copy covers
    constexpr int CPL = WK / RPU;           // copies per lane per slice (K, and V again)
    constexpr unsigned TILE = WK * RB;      // bytes of one K (or V) slice
    constexpr unsigned SLICE = 2 * TILE;    // K and V of one warp's slice
    constexpr unsigned STAGE = kWarps * SLICE;
    constexpr unsigned Q_BYTES = ROWS * D * 2;
    // KV8 with per-token descales: the 16 K and 16 V descales of each warp's slice.
    constexpr unsigned DS_BYTES = KV8 ? NS * kWarps * 2 * WK * 4 : 0;
    static_assert(CPL * RPU == WK, "a slice must split evenly over the lanes");
    static_assert(kWarps * ROWS * D * 4 <= NS * STAGE, "merge buffer must fit");
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float sMax[kWarps][ROWS], sSum[kWarps][ROWS];

    if (p.head_dim != D) __trap();
    if constexpr (KV8) {  // the manifest picks the entry by the case (the 2-byte entries
        if (p.fp8 != FA_FP8_KV) __trap();  // are left as they were: no test of theirs)
    }
    if (fa_dynamic_smem_bytes() < Q_BYTES + NS * STAGE + DS_BYTES) __trap();
    const unsigned sQ = smem_u32(smem);
    const unsigned sKV = sQ + Q_BYTES;
    const unsigned sDS = sKV + NS * STAGE;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, q4 = lane & 3;  // mma fragment row and column pair
    const int split = blockIdx.x, b = blockIdx.z;
    const int group = p.heads / p.kv_heads;
    const int row_chunks = (group * p.seqlen_q + ROWS - 1) / ROWS;
    const int kvh = blockIdx.y / row_chunks;
    const int rc = blockIdx.y - kvh * row_chunks;
    if (gridDim.y != p.kv_heads * row_chunks) __trap();  // the manifest's block_rows is ROWS
    const Seq sq = sequence(p, b);

    // The CTA's 16 rows, worked out once (thread r: row r) for every thread to read.
    __shared__ Row sRow[ROWS];
    if (tid < ROWS) sRow[tid] = query_row(p, sq, kvh, rc, tid, group);
    __syncthreads();
    // [cta_lo, cta_hi): the keys some row of this CTA sees. [all_lo, all_hi): the keys
    // every row it writes sees (slices inside it need no mask).
    int cta_lo = 0x7fffffff, cta_hi = 0, all_lo = 0, all_hi = 0x7fffffff;
#pragma unroll 4
    for (int r = 0; r < ROWS; ++r) {
        const Row w = sRow[r];
        if (w.hi > w.lo) {
            cta_lo = min(cta_lo, w.lo);
            cta_hi = max(cta_hi, w.hi);
        }
        if (w.mine) {
            all_lo = max(all_lo, w.lo);
            all_hi = min(all_hi, w.hi);
        }
    }
    if (cta_hi == 0) cta_lo = 0;
    const bool need_mask = (p.mask_kind & FA_MASK_BOOL) != 0;
    const Row mine0 = sRow[g], mine1 = sRow[g + 8];
    // This split's chunks: the CTA's chunk range, spread evenly over the splits.
    const int c0 = cta_lo / CHUNK;
    const int nchunks = cta_hi > cta_lo ? (cta_hi + CHUNK - 1) / CHUNK - c0 : 0;
    const int c_begin = c0 + (int)((long long)split * nchunks / p.num_splits);
    const int n_iter = c0 + (int)((long long)(split + 1) * nchunks / p.num_splits) - c_begin;

    // K/V rows of this kv head: dense and varlen rows are contiguous from kbase; paged
    // rows are found through the block table (the page stride is k_batch_stride).
    const bool paged = p.layout == FA_LAYOUT_PAGED;
    long long kbase = kvh * p.k_head_stride, vbase = kvh * p.v_head_stride;
    if (p.layout == FA_LAYOUT_DENSE) {
        kbase += b * p.k_batch_stride;
        vbase += b * p.v_batch_stride;
    } else if (p.layout == FA_LAYOUT_VARLEN) {
        kbase += (long long)sq.k_start * p.k_row_stride;
        vbase += (long long)sq.k_start * p.v_row_stride;
    }
    const int* table = paged ? p.block_table + b * p.block_table_stride : nullptr;
    const int ps = paged ? p.page_size : 1;
    // A 16-aligned slice lies in one page when the page size is a multiple of 16: one
    // table lookup per slice, made a slice ahead so that its latency hides behind compute.
    // Other page sizes look every row up.
    const bool per_row_pages = paged && (ps % WK) != 0;
    const int lrow = lane / CPR, lch = lane % CPR;  // this lane's first row and its chunk
    const long long klane = (long long)lrow * p.k_row_stride + lch * (16 / ES);
    const long long vlane = (long long)lrow * p.v_row_stride + lch * (16 / ES);
    const long long kstep = (long long)ES * RPU * p.k_row_stride;
    const long long vstep = (long long)ES * RPU * p.v_row_stride;
    // KV8 descales: one per key (per token, found like its row) or one for the CTA's
    // kv head (folded into the score scale and applied to O at the end).
    bool per_key = false;
    float k_scale = 1.f, v_scale = 1.f;
    if constexpr (KV8) {
        per_key = p.kd_row_stride != 0 || (paged && p.kd_batch_stride != 0);
        if (!per_key) {
            const long long o = (p.layout == FA_LAYOUT_DENSE ? b * p.kd_batch_stride : 0) +
                                kvh * p.kd_head_stride;
            k_scale = __ldg(p.k_descale + o);
            v_scale = __ldg(p.v_descale + o);
        }
    }
    // KV8: a per-head K descale is folded into the softmax scale (the 2-byte entries
    // read p.scale_log2 where they use it, as they always did).
    const float sl2_kv8 = p.scale_log2 * k_scale;
#define SK_SL2 (KV8 ? sl2_kv8 : p.scale_log2)

    // Issue the copies of slice `it` (keys j0 .. j0 + 15 of chunk c_begin + it) into
    // stage buffer `buf`; keys outside [cta_lo, cta_hi) are zero-filled, never read.
    // Paged: `page` holds the slice's keys from slot `slot0` on.
    auto issue = [&](int it, int buf, int page, int slot0) {
        const int j0 = (c_begin + it) * CHUNK + warp * WK;
        const unsigned dk = sKV + buf * STAGE + warp * SLICE;
        const unsigned dv = dk + TILE;
        if (KV8 && per_key) {  // lanes 0-15: K's descales of the slice's keys; 16-31: V's
            const int i = lane & 15, j = j0 + i;
            const bool ok = j >= cta_lo && j < cta_hi;
            long long o = 0;
            if (ok) {
                if (paged) {
                    const int pg = per_row_pages ? __ldg(table + j / ps) : page;
                    const int slot = per_row_pages ? j % ps : slot0 + i;
                    o = (long long)pg * p.kd_batch_stride + (long long)slot * p.kd_row_stride;
                } else if (p.layout == FA_LAYOUT_VARLEN) {
                    o = (long long)(sq.k_start + j) * p.kd_row_stride;
                } else {
                    o = b * p.kd_batch_stride + (long long)j * p.kd_row_stride;
                }
                o += kvh * p.kd_head_stride;
            }
            cp_async4(sDS + ((buf * kWarps + warp) * 32 + lane) * 4,
                      (lane < 16 ? p.k_descale : p.v_descale) + o, ok ? 4 : 0);
        }
        if (per_row_pages) {
#pragma unroll 1
            for (int u = 0; u < CPL; ++u) {
                const int row = u * RPU + lrow, j = j0 + row;
                const bool ok = j >= cta_lo && j < cta_hi;
                const int pg = ok ? __ldg(table + j / ps) : 0, slot = j % ps;
                const long long ko = kbase + (long long)pg * p.k_batch_stride +
                                     (long long)slot * p.k_row_stride + lch * (16 / ES);
                const long long vo = vbase + (long long)pg * p.v_batch_stride +
                                     (long long)slot * p.v_row_stride + lch * (16 / ES);
                if constexpr (KV8) {
                    cp_async16(dk + swzb<RB>(row, lch), (const char*)p.k + (ok ? ko : 0), ok ? 16 : 0);
                    cp_async16(dv + swzb<RB>(row, lch), (const char*)p.v + (ok ? vo : 0), ok ? 16 : 0);
                } else {
                    cp_async16(dk + swz<D>(row, lch), (const unsigned short*)p.k + (ok ? ko : 0), ok ? 16 : 0);
                    cp_async16(dv + swz<D>(row, lch), (const unsigned short*)p.v + (ok ? vo : 0), ok ? 16 : 0);
                }
            }
            return;
        }
        long long k0 = kbase + klane, v0 = vbase + vlane;
        if (paged) {
            k0 += (long long)page * p.k_batch_stride + (long long)slot0 * p.k_row_stride;
            v0 += (long long)page * p.v_batch_stride + (long long)slot0 * p.v_row_stride;
        } else {
            k0 += (long long)j0 * p.k_row_stride;
            v0 += (long long)j0 * p.v_row_stride;
        }
        const char* ksrc = (const char*)p.k + ES * k0;
        const char* vsrc = (const char*)p.v + ES * v0;
        if (j0 >= cta_lo && j0 + WK <= cta_hi) {  // the whole slice: no per-row test
#pragma unroll
            for (int u = 0; u < CPL; ++u) {
                const int row = u * RPU + lrow;
                cp_async16(dk + swzb<RB>(row, lch), ksrc + u * kstep);
                cp_async16(dv + swzb<RB>(row, lch), vsrc + u * vstep);
            }
            return;
        }
#pragma unroll
        for (int u = 0; u < CPL; ++u) {
            const int row = u * RPU + lrow, j = j0 + row;
            const bool ok = j >= cta_lo && j < cta_hi;
            cp_async16(dk + swzb<RB>(row, lch), ok ? ksrc + u * kstep : (const char*)p.k, ok ? 16 : 0);
            cp_async16(dv + swzb<RB>(row, lch), ok ? vsrc + u * vstep : (const char*)p.v, ok ? 16 : 0);
        }
    };
    // The page of slice `it` and its first slot (dense and per-row lookups: unused; a
    // slice with no key to read: no lookup, its table entry may not exist).
    auto page_of = [&](int it, int& slot0) -> int {
        slot0 = 0;
        const int j0 = (c_begin + it) * CHUNK + warp * WK;
        if (!paged || per_row_pages || it >= n_iter || j0 >= cta_hi || j0 + WK <= cta_lo)
            return 0;
        const int idx = j0 / ps;
        slot0 = j0 - idx * ps;
        return __ldg(table + idx);
    };

    // Q rows (zero for rows not ours), then the first slices: all in flight together.
    {
        const unsigned short* Q = (const unsigned short*)p.q;
        constexpr int QCPR = D / 8;  // 16-byte chunks per Q row (2-byte elements)
#pragma unroll
        for (int u = 0; u < ROWS * QCPR / kThreads; ++u) {
            const int idx = u * kThreads + tid;
            const int r = idx / QCPR, ch = idx % QCPR;
            const Row w = sRow[r];
            const long long qo = q_offset(p, sq, b, w.h, w.i, p.q_batch_stride,
                                          p.q_head_stride, p.q_row_stride);
            cp_async16(sQ + swz<D>(r, ch), w.mine ? (const void*)(Q + qo + ch * 8) : p.q,
                       w.mine ? 16 : 0);
        }
        cp_async_commit();
    }
#pragma unroll
    for (int st = 0; st < NS - 1; ++st) {
        int slot0;
        const int page = page_of(st, slot0);
        if (st < n_iter) issue(st, st, page, slot0);
        cp_async_commit();
    }
    int next_slot;
    int next_page = page_of(NS - 1, next_slot);

    cp_async_wait<NS - 1>();  // Q landed (the oldest group)
    __syncthreads();
    unsigned qf[KD][4];
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
        if constexpr (KV8) {
            // The k order of an e4m3 K fragment (kv8_frag): k 2 q4 + e holds element
            // 4 q4 + e of the 16, k 8 + 2 q4 + e element 4 q4 + 2 + e; Q's A fragment
            // follows it (the sum over k does not depend on the order).
            const int ch = kk * 2 + (q4 >> 1), off = (q4 & 1) * 8;
            lds_v2(sQ + swz<D>(g, ch) + off, qf[kk][0], qf[kk][2]);
            lds_v2(sQ + swz<D>(g + 8, ch) + off, qf[kk][1], qf[kk][3]);
        } else {
            ldsm_x4(sQ + swz<D>(lane & 15, kk * 2 + (lane >> 4)), qf[kk][0], qf[kk][1],
                    qf[kk][2], qf[kk][3]);
        }
    }

    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    float m_run[2] = {neg_inf(), neg_inf()};
    float l_run[2] = {0.f, 0.f};

    int buf = 0;  // stage buffer of slice `it`; slice it + NS - 1 goes to the one before it
#pragma unroll 1
    for (int it = 0; it < n_iter; ++it) {
        if (it + NS - 1 < n_iter)
            issue(it + NS - 1, buf == 0 ? NS - 1 : buf - 1, next_page, next_slot);
        cp_async_commit();
        next_page = page_of(it + NS, next_slot);
        cp_async_wait<NS - 1>();
        __syncwarp();  // every lane's copies of slice `it` are visible to the warp

        const unsigned sK = sKV + buf * STAGE + warp * SLICE;
        const unsigned sV = sK + TILE;
        const unsigned sD = sDS + (buf * kWarps + warp) * 32 * 4;
        const int j0 = (c_begin + it) * CHUNK + warp * WK;
        buf = buf + 1 == NS ? 0 : buf + 1;

        float s[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
        float vd[2][2];  // KV8 per-token: V's descales of this lane's P columns
        if constexpr (KV8) {
            // One ldmatrix: keys 0-7 and 8-15 of 16-element chunks kk and kk + 1, a lane's
            // register holding elements 4 q4 .. 4 q4 + 3 of key g (kv8_frag's k order).
#pragma unroll
            for (int kk = 0; kk < KD; kk += 2) {
                unsigned r0, r1, r2, r3;
                ldsm_x4(sK + swzb<RB>((lane & 7) + (((lane >> 3) & 1) << 3), kk + (lane >> 4)),
                        r0, r1, r2, r3);
                M::mma(s[0], qf[kk], M::e4m3x2(r0), M::e4m3x2(r0 >> 16));
                M::mma(s[1], qf[kk], M::e4m3x2(r1), M::e4m3x2(r1 >> 16));
                M::mma(s[0], qf[kk + 1], M::e4m3x2(r2), M::e4m3x2(r2 >> 16));
                M::mma(s[1], qf[kk + 1], M::e4m3x2(r3), M::e4m3x2(r3 >> 16));
            }
            if (per_key) {  // s[t][e] is key 8 t + 2 q4 + (e % 2) of the slice
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    float k0, k1;
                    lds_v2f(sD + (t * 8 + q4 * 2) * 4, k0, k1);
                    lds_v2f(sD + (WK + t * 8 + q4 * 2) * 4, vd[t][0], vd[t][1]);
                    s[t][0] *= k0;
                    s[t][1] *= k1;
                    s[t][2] *= k0;
                    s[t][3] *= k1;
                }
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(sK + swz<D>((lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)),
                        b0, b1, b2, b3);
                M::mma(s[0], qf[kk], b0, b1);
                M::mma(s[1], qf[kk], b2, b3);
            }
        }
        // Mask (s[t][e] is row g + 8 (e / 2), key j0 + 8 t + 2 q4 + (e % 2)), unless every
        // row this CTA writes sees the whole slice.
        if (need_mask || j0 < all_lo || j0 + WK > all_hi) {
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const Row& w = (e >> 1) ? mine1 : mine0;
                    const int j = j0 + t * 8 + q4 * 2 + (e & 1);
                    bool vis = j >= w.lo && j < w.hi;
                    if (need_mask && vis) vis = fa_bool_mask_ok(p, b, w.i, j);
                    if (!vis) s[t][e] = neg_inf();
                }
        }

        // Online softmax in the exp2 domain, per fragment row (a quad holds one row).
        float m_use[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[r], mx * SK_SL2);
            // -inf guard: nothing visible yet -> subtract 0, so exp2(-inf) = 0, never NaN.
            m_use[r] = m_new == neg_inf() ? 0.f : m_new;
            alpha[r] = exp2f(m_run[r] - m_use[r]);
            m_run[r] = m_new;
            l_run[r] *= alpha[r];
        }
        // The running max rarely moves after the first slices: skip the O rescale then.
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                acc[t][0] *= alpha[0];
                acc[t][1] *= alpha[0];
                acc[t][2] *= alpha[1];
                acc[t][3] *= alpha[1];
            }
        }
        unsigned pf[4];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const float p0 = exp2f(fmaf(s[t][0], SK_SL2, -m_use[0]));
            const float p1 = exp2f(fmaf(s[t][1], SK_SL2, -m_use[0]));
            const float p2 = exp2f(fmaf(s[t][2], SK_SL2, -m_use[1]));
            const float p3 = exp2f(fmaf(s[t][3], SK_SL2, -m_use[1]));
            l_run[0] += p0 + p1;
            l_run[1] += p2 + p3;
            // A fragment of P: keys 0-7 in a0 (row g), a1 (row g + 8); 8-15 in a2, a3.
            // Per-token V descales scale P's columns (the sum l took P unscaled).
            if (KV8 && per_key) {
                pf[t * 2 + 0] = M::pack(p0 * vd[t][0], p1 * vd[t][1]);
                pf[t * 2 + 1] = M::pack(p2 * vd[t][0], p3 * vd[t][1]);
            } else {
                pf[t * 2 + 0] = M::pack(p0, p1);
                pf[t * 2 + 1] = M::pack(p2, p3);
            }
        }
        if constexpr (KV8) {
            // ldmatrix.trans moves 2-byte pairs: a lane gets keys 2 q4, 2 q4 + 1 (r0) and
            // 8 + 2 q4, 9 + 2 q4 (r1) of elements 16 c + 2 g and 16 c + 2 g + 1. Bytes
            // regrouped by element are B fragments for column g of two n8 tiles: tile
            // 2 c holds elements 16 c + 2 n, tile 2 c + 1 elements 16 c + 2 n + 1
            // (the merge below puts them back in order).
#pragma unroll
            for (int c = 0; c < D / 16; c += 2) {
                unsigned r0, r1, r2, r3;
                ldsm_x4_t(sV + swzb<RB>((lane & 7) + (((lane >> 3) & 1) << 3), c + (lane >> 4)),
                          r0, r1, r2, r3);
                const unsigned e0 = prmt(r0, r1, 0x6420), o0 = prmt(r0, r1, 0x7531);
                const unsigned e1 = prmt(r2, r3, 0x6420), o1 = prmt(r2, r3, 0x7531);
                M::mma(acc[2 * c], pf, M::e4m3x2(e0), M::e4m3x2(e0 >> 16));
                M::mma(acc[2 * c + 1], pf, M::e4m3x2(o0), M::e4m3x2(o0 >> 16));
                M::mma(acc[2 * c + 2], pf, M::e4m3x2(e1), M::e4m3x2(e1 >> 16));
                M::mma(acc[2 * c + 3], pf, M::e4m3x2(o1), M::e4m3x2(o1 >> 16));
            }
        } else {
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(sV + swz<D>((lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)),
                          b0, b1, b2, b3);
                M::mma(acc[2 * dp], pf, b0, b1);
                M::mma(acc[2 * dp + 1], pf, b2, b3);
            }
        }
        __syncwarp();  // the slice is consumed before a later issue overwrites it
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stage buffers: reuse them for merging

    // Merge the warps: each holds (max, sum, O) of its keys for the 16 rows.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    float* sO = reinterpret_cast<float*>(smem + Q_BYTES);  // [kWarps][ROWS][D]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = g + 8 * r;
        if (!(r ? mine1 : mine0).mine) continue;
        if (q4 == 0) {
            sMax[warp][row] = m_run[r];
            sSum[warp][row] = l_run[r];
        }
        float* o = sO + (warp * ROWS + row) * D;
        if constexpr (KV8) {  // tiles 2 c, 2 c + 1 column 2 q4 + e: element 16 c + 4 q4 + 2 e (+ 1)
#pragma unroll
            for (int c = 0; c < D / 16; ++c)
                *reinterpret_cast<float4*>(o + c * 16 + q4 * 4) =
                    make_float4(acc[2 * c][2 * r], acc[2 * c + 1][2 * r], acc[2 * c][2 * r + 1],
                                acc[2 * c + 1][2 * r + 1]);
        } else {
#pragma unroll
            for (int t = 0; t < NT; ++t)
                *reinterpret_cast<float2*>(o + t * 8 + q4 * 2) =
                    make_float2(acc[t][2 * r], acc[t][2 * r + 1]);
        }
    }
    __syncthreads();

    const long long total = (long long)p.batch * p.heads * p.seqlen_q;
    for (int idx = tid; idx < ROWS * D; idx += kThreads) {
        const int r = idx / D, c = idx - r * D;
        const Row w = sRow[r];
        if (!w.mine) continue;
        float mx = neg_inf();
#pragma unroll
        for (int k = 0; k < kWarps; ++k) mx = fmaxf(mx, sMax[k][r]);
        float L = 0.f, o = 0.f;
        if (mx != neg_inf()) {
#pragma unroll
            for (int k = 0; k < kWarps; ++k) {
                const float e = exp2f(sMax[k][r] - mx);  // a warp that saw nothing: 0
                L = fmaf(e, sSum[k][r], L);
                o = fmaf(e, sO[(k * ROWS + r) * D + c], o);
            }
        }
        const float out = L > 0.f ? (KV8 ? o / L * v_scale : o / L) : 0.f;
        const float lse = L > 0.f ? (mx + log2f(L)) * FA_LN2 : neg_inf();
        if (p.num_splits == 1) {
            unsigned short* O = (unsigned short*)p.o +
                                q_offset(p, sq, b, w.h, w.i, p.o_batch_stride, p.o_head_stride,
                                         p.o_row_stride);
            O[c] = FaElem<DT>::from_float(out);
            if (c == 0 && p.lse != nullptr) p.lse[lse_index(p, sq, b, w.h, w.i)] = lse;
        } else {
            const long long row = ((long long)b * p.heads + w.h) * p.seqlen_q + w.i;
            ((float*)p.workspace[0])[((long long)split * total + row) * D + c] = out;
            if (c == 0) ((float*)p.workspace[1])[(long long)split * total + row] = lse;
        }
    }
#if SK_FUSED_COMBINE
    // The last split of this row chunk to finish combines them all: every CTA publishes
    // its partials (fence) before taking a ticket; the one that draws the last ticket
    // resets the counter for the next call and reads the others' partials from L2.
    __shared__ int sLast;
    if (p.num_splits > 1) {
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            int* ticket = (int*)p.workspace[2] + ((long long)b * gridDim.y + blockIdx.y);
            sLast = atomicAdd(ticket, 1) == p.num_splits - 1;
            if (sLast) atomicExch(ticket, 0);
        }
        __syncthreads();
        if (sLast) {
            __threadfence();
            combine_tile<DT, D, KV8>(p, sq, b, sRow);
        }
    }
#endif
}

#undef SK_SL2
}  // namespace sk

#define SK_ENTRIES(SHORT, DT, D)                                                              \
    extern "C" __global__ void __launch_bounds__(sk::kThreads, SK_MIN_BLOCKS)                 \
        splitkv_partial_##SHORT##_d##D(FaParams p) {                                          \
        sk::partial<DT, D, false>(p);                                                         \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(sk::kThreads, SK_MIN_BLOCKS)                 \
        splitkv_partial8_##SHORT##_d##D(FaParams p) {                                         \
        sk::partial<DT, D, true>(p);                                                          \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(sk::kThreads) splitkv_combine_##SHORT##_d##D( \
        FaParams p) {                                                                         \
        sk::combine<DT, D>(p);                                                                \
    }
SK_ENTRIES(fp16, FA_DTYPE_FP16, 64)
SK_ENTRIES(fp16, FA_DTYPE_FP16, 128)
SK_ENTRIES(bf16, FA_DTYPE_BF16, 64)
SK_ENTRIES(bf16, FA_DTYPE_BF16, 128)
