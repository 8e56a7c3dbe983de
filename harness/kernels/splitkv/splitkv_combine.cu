// splitkv_combine.cu: the combine of the split-KV kernel's partial results (splitkv.cu
// says the whole algorithm): by the last CTA of a row chunk (SK_FUSED_COMBINE, as
// shipped), or as a second kernel, one block per query row.
#include "fa_harness.h"

namespace sk {

// The combine of one row chunk's splits, by all threads of the CTA (SK_FUSED_COMBINE):
// per row lse = logsumexp_s lse_s (a warp per row), then per (row, 4 dims)
// O = sum_s exp(lse_s - lse) O_s with U partials in flight per thread. TAG: one copy
// per partial kernel (the 2-byte and the e4m3-cache ones), each with its own shared
// scratch, so that the 2-byte entries' shared layout is the one they always had.
template <int DT, int D, int TAG = 0>
__device__ __forceinline__ void combine_tile(const FaParams& p, const Seq& sq, int b,
                                             const Row* rows) {
    constexpr int C4 = D / 4;
    constexpr int U = 16;
    __shared__ float sLse[ROWS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int S = p.num_splits;
    const long long total = (long long)p.batch * p.heads * p.seqlen_q;
    const float* plse = (const float*)p.workspace[1];
    const float* po = (const float*)p.workspace[0];
    for (int r = warp; r < ROWS; r += kWarps) {
        if (!rows[r].mine) continue;
        const long long row = ((long long)b * p.heads + rows[r].h) * p.seqlen_q + rows[r].i;
        float mx = neg_inf();
        for (int s = lane; s < S; s += 32) mx = fmaxf(mx, __ldcg(plse + s * total + row));
        mx = fa_warp_max(mx);
        float sum = 0.f;
        if (mx != neg_inf())
            for (int s = lane; s < S; s += 32) sum += expf(__ldcg(plse + s * total + row) - mx);
        sum = fa_warp_sum(sum);
        if (lane == 0) sLse[r] = mx == neg_inf() ? neg_inf() : mx + logf(sum);
    }
    __syncthreads();
    for (int t = tid; t < ROWS * C4; t += kThreads) {
        const int r = t / C4, c4 = t - r * C4;
        const Row w = rows[r];
        if (!w.mine) continue;
        const long long row = ((long long)b * p.heads + w.h) * p.seqlen_q + w.i;
        const float lse = sLse[r];
        float a[4] = {0.f, 0.f, 0.f, 0.f};
        if (lse != neg_inf()) {
            for (int s0 = 0; s0 < S; s0 += U) {
                float ws[U], ov[U][4];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int s = s0 + u;
                    const bool ok = s < S;
                    ws[u] = ok ? __ldcg(plse + s * total + row) : neg_inf();
                    load_cg<4>(po + ((ok ? s : 0) * total + row) * D + c4 * 4, ov[u]);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float wt = expf(ws[u] - lse);  // an empty split: exp(-inf) = 0
                    wt = wt > 0.f ? wt : 0.f;      // a NaN weight counts 0 too
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[e] = fmaf(wt, ov[u][e], a[e]);
                }
            }
        }
        unsigned short* O = (unsigned short*)p.o +
                            q_offset(p, sq, b, w.h, w.i, p.o_batch_stride, p.o_head_stride,
                                     p.o_row_stride) + c4 * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) O[e] = FaElem<DT>::from_float(a[e]);
        if (c4 == 0 && p.lse != nullptr) p.lse[lse_index(p, sq, b, w.h, w.i)] = lse;
    }
}

// One block (kThreads) per logical row (sequence, head, query position).
template <int DT, int D>
__device__ __forceinline__ void combine(const FaParams& p) {
    constexpr int DPL = D / 32;  // dims per lane
    constexpr int U = 8;         // partial rows in flight per warp
    __shared__ float sRed[kWarps];
    __shared__ __align__(16) float sAcc[kWarps][D];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long total = (long long)p.batch * p.heads * p.seqlen_q;
    const long long row = blockIdx.x;
    if (row >= total) return;
    const int i = (int)(row % p.seqlen_q);
    const long long bh = row / p.seqlen_q;
    const int h = (int)(bh % p.heads), b = (int)(bh / p.heads);
    const Seq sq = sequence(p, b);
    if (p.layout == FA_LAYOUT_VARLEN && i >= sq.q_len) return;  // not a row of sequence b
    const int S = p.num_splits;
    const float* plse = (const float*)p.workspace[1];
    const float* po = (const float*)p.workspace[0];

    // lse = logsumexp over the splits (block-wide max, then sum).
    float mx = neg_inf();
    for (int s = tid; s < S; s += kThreads) mx = fmaxf(mx, __ldcg(plse + s * total + row));
    mx = fa_warp_max(mx);
    if (lane == 0) sRed[warp] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(sRed[0], sRed[1]), fmaxf(sRed[2], sRed[3]));
    __syncthreads();
    float sum = 0.f;
    if (mx != neg_inf())
        for (int s = tid; s < S; s += kThreads) sum += expf(__ldcg(plse + s * total + row) - mx);
    sum = fa_warp_sum(sum);
    if (lane == 0) sRed[warp] = sum;
    __syncthreads();
    sum = sRed[0] + sRed[1] + sRed[2] + sRed[3];
    const float lse = mx == neg_inf() ? neg_inf() : mx + logf(sum);

    // O = sum_s w_s O_s: warp k takes splits k, k + 4, ...; U loads issued before use.
    float acc[DPL];
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[e] = 0.f;
    if (lse != neg_inf()) {
        for (int s0 = warp; s0 < S; s0 += kWarps * U) {
            float ws[U], ov[U][DPL];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int s = s0 + u * kWarps;
                const bool ok = s < S;
                ws[u] = ok ? __ldcg(plse + s * total + row) : neg_inf();
                load_cg<DPL>(po + ((ok ? s : 0) * total + row) * D + lane * DPL, ov[u]);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float w = expf(ws[u] - lse);  // an empty split: exp(-inf) = 0
                w = w > 0.f ? w : 0.f;        // a NaN weight counts 0 too
#pragma unroll
                for (int e = 0; e < DPL; ++e) acc[e] = fmaf(w, ov[u][e], acc[e]);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < DPL; ++e) sAcc[warp][lane * DPL + e] = acc[e];
    __syncthreads();
    if (tid < D) {
        const float o = sAcc[0][tid] + sAcc[1][tid] + sAcc[2][tid] + sAcc[3][tid];
        unsigned short* O = (unsigned short*)p.o +
                            q_offset(p, sq, b, h, i, p.o_batch_stride, p.o_head_stride,
                                     p.o_row_stride);
        O[tid] = FaElem<DT>::from_float(o);
        if (tid == 0 && p.lse != nullptr) p.lse[lse_index(p, sq, b, h, i)] = lse;
    }
}

}  // namespace sk
