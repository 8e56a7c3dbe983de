// splitkv: split-KV ("flash-decoding") forward for decoding and short query blocks.
//
// Decoding is memory bound: one query row per head against a long K/V cache. With few
// (batch, head) pairs there are too few blocks to fill the GPU, so the keys are split:
//
//   kernel 1 (splitkv_partial_*): grid = (split, kv head x row chunk, batch). A block
//       streams its split's K/V range ONCE for all query heads of one GQA group (up to
//       4 query rows per block), in chunks of 128 keys:
//         phase 1  scores of the chunk, 4 warps x 32 keys, 16-byte loads, q in registers
//         phase 2  per row: chunk max, online-softmax rescale, p = exp2(s - m) in place
//         phase 3  acc += p V, 16-byte loads of V
//       It writes a partial O (already divided by its own l) and a partial LSE per split,
//       or the final O and LSE directly when there is a single split.
//   kernel 2 (splitkv_combine_*): lse = logsumexp_s lse_s, O = sum_s exp(lse_s - lse) O_s,
//       with the weight of an empty split (lse_s = -inf) or a NaN weight taken as 0.
//
// Workspaces: [0] partial O fp32 (splits, B, H, Nq, d), [1] partial LSE fp32 (splits, B, H, Nq).
#include "fa_harness.h"

#define SK_ROWS 4       // query rows per block (a GQA group of 4 at Nq = 1)
#define SK_THREADS 128
#define SK_NW 4         // warps
#define SK_CH 128       // keys per chunk: 32 per warp
#define SK_B1 4         // phase-1 steps whose loads are issued together
#define SK_B3 8         // phase-3 steps whose loads are issued together

template <int DT, int D>
__device__ __forceinline__ void splitkv_partial(const FaParams& p) {
    constexpr int LK = D / 16;    // lanes per key in phase 1 (16 elements each)
    constexpr int KPS = 32 / LK;  // keys per warp step
    constexpr int ST1 = 32 / KPS; // steps to cover the warp's 32 keys
    constexpr int LV = D / 8;     // lanes per V row in phase 3 (8 elements each)
    constexpr int KPV = 32 / LV;
    constexpr int ST3 = 32 / KPV;
    static_assert(ST1 % SK_B1 == 0 && ST3 % SK_B3 == 0, "batch sizes must divide the steps");

    __shared__ float sS[SK_ROWS][SK_CH];  // scores, then probabilities, of the current chunk
    __shared__ float sM[SK_ROWS], sL[SK_ROWS], sA[SK_ROWS];  // running max, sum, last rescale
    __shared__ __align__(16) float sAcc[SK_NW][SK_ROWS][D];  // per-warp partial outputs

    if (p.head_dim != D) __trap();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int split = blockIdx.x, b = blockIdx.z;
    const int group = p.heads / p.kv_heads;
    const int nq = p.seqlen_q, nk = p.seqlen_k;
    const int nrows = group * nq;  // query rows sharing kv head kvh: (g, i) -> g * nq + i
    const int row_chunks = (nrows + SK_ROWS - 1) / SK_ROWS;
    const int kvh = blockIdx.y / row_chunks;
    const int rc = blockIdx.y - kvh * row_chunks;
    const bool causal = (p.mask_kind & FA_MASK_CAUSAL) != 0;
    int kb_end = nk;
    if (p.mask_kind & FA_MASK_KEY_PADDING) kb_end = min(kb_end, p.seqlens_k[b]);

    int row_h[SK_ROWS], row_i[SK_ROWS], row_end[SK_ROWS];
    int cta_end = 0;
#pragma unroll
    for (int rr = 0; rr < SK_ROWS; ++rr) {
        const int r = rc * SK_ROWS + rr;
        const int g = r / nq;
        row_i[rr] = r < nrows ? r - g * nq : 0;
        row_h[rr] = kvh * group + (r < nrows ? g : 0);
        int e = causal ? min(kb_end, row_i[rr] + p.causal_offset + 1) : kb_end;
        row_end[rr] = (r < nrows && e > 0) ? e : 0;  // keys [0, row_end) can be visible
        cta_end = max(cta_end, row_end[rr]);
    }
    // This split's keys: whole chunks, spread evenly over the splits.
    const int n_chunks = (nk + SK_CH - 1) / SK_CH;
    const int c_begin = (int)((long long)split * n_chunks / p.num_splits);
    const int c_end = (int)((long long)(split + 1) * n_chunks / p.num_splits);
    const int key_lo = c_begin * SK_CH;
    const int key_hi = min(c_end * SK_CH, cta_end);  // nothing past it is visible

    const unsigned short* K = (const unsigned short*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
    const unsigned short* V = (const unsigned short*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;

    // q slice of this lane (16 elements at sl * 16), pre-scaled into the log2 domain.
    const int sl = lane % LK, kk = lane / LK;
    float qf[SK_ROWS][16];
#pragma unroll
    for (int rr = 0; rr < SK_ROWS; ++rr) {
        if (rc * SK_ROWS + rr < nrows) {
            const uint4* g = reinterpret_cast<const uint4*>(
                (const unsigned short*)p.q + b * p.q_batch_stride + row_h[rr] * p.q_head_stride +
                (long long)row_i[rr] * p.q_row_stride + sl * 16);
            fa_unpack8<DT>(__ldg(g), qf[rr]);
            fa_unpack8<DT>(__ldg(g + 1), qf[rr] + 8);
#pragma unroll
            for (int e = 0; e < 16; ++e) qf[rr][e] *= p.scale_log2;
        } else {
#pragma unroll
            for (int e = 0; e < 16; ++e) qf[rr][e] = 0.f;
        }
    }
    if (tid < SK_ROWS) {
        sM[tid] = FA_NEG_INF;
        sL[tid] = 0.f;
        sA[tid] = 1.f;
    }
    const int vsl = lane % LV, kv = lane / LV;  // phase 3: dims vsl * 8 .. +8 of key kv
    float acc[SK_ROWS][8];
#pragma unroll
    for (int rr = 0; rr < SK_ROWS; ++rr)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[rr][e] = 0.f;

    for (int ck = key_lo; ck < key_hi; ck += SK_CH) {
        __syncthreads();  // sS is free again (phase 3 of the previous chunk is done)
        const int wk0 = ck + warp * 32;  // this warp's 32 keys

        // Phase 1: scores.
#pragma unroll
        for (int st0 = 0; st0 < ST1; st0 += SK_B1) {
            uint4 kr[SK_B1][2];
#pragma unroll
            for (int u = 0; u < SK_B1; ++u) {
                const int j = wk0 + (st0 + u) * KPS + kk;
                if (j < key_hi) {
                    const uint4* g = reinterpret_cast<const uint4*>(K + (long long)j * p.k_row_stride + sl * 16);
                    kr[u][0] = __ldg(g);
                    kr[u][1] = __ldg(g + 1);
                } else {
                    kr[u][0] = make_uint4(0u, 0u, 0u, 0u);
                    kr[u][1] = make_uint4(0u, 0u, 0u, 0u);
                }
            }
#pragma unroll
            for (int u = 0; u < SK_B1; ++u) {
                float kf[16];
                fa_unpack8<DT>(kr[u][0], kf);
                fa_unpack8<DT>(kr[u][1], kf + 8);
                float part[SK_ROWS];
#pragma unroll
                for (int rr = 0; rr < SK_ROWS; ++rr) {
                    float s = 0.f;
#pragma unroll
                    for (int e = 0; e < 16; ++e) s = fmaf(qf[rr][e], kf[e], s);
                    part[rr] = s;
                }
#pragma unroll
                for (int o = LK / 2; o > 0; o >>= 1)
#pragma unroll
                    for (int rr = 0; rr < SK_ROWS; ++rr)
                        part[rr] += __shfl_xor_sync(0xffffffffu, part[rr], o);
                const int jl = (st0 + u) * KPS + kk;
                const int j = wk0 + jl;
                if (sl == 0) {
#pragma unroll
                    for (int rr = 0; rr < SK_ROWS; ++rr) {
                        const bool vis = j < row_end[rr] && fa_bool_mask_ok(p, b, row_i[rr], j);
                        sS[rr][warp * 32 + jl] = vis ? part[rr] : FA_NEG_INF;
                    }
                }
            }
        }
        __syncthreads();

        // Phase 2: online softmax over the chunk, one warp per row.
        if (warp < SK_ROWS) {
            float v[SK_CH / 32];
            float mt = FA_NEG_INF;
#pragma unroll
            for (int t = 0; t < SK_CH / 32; ++t) {
                v[t] = sS[warp][lane + 32 * t];
                mt = fmaxf(mt, v[t]);
            }
            mt = fa_warp_max(mt);
            const float m_old = sM[warp];
            const float m_new = fmaxf(m_old, mt);
            const float m_use = m_new == FA_NEG_INF ? 0.f : m_new;  // -inf guard
            const float alpha = exp2f(m_old - m_use);
            float sum = 0.f;
#pragma unroll
            for (int t = 0; t < SK_CH / 32; ++t) {
                const float e = exp2f(v[t] - m_use);
                sS[warp][lane + 32 * t] = e;
                sum += e;
            }
            sum = fa_warp_sum(sum);
            // Every lane read sM[warp] above; lane 0 overwrites it below. The shuffles
            // between the two converge the warp but do not order shared memory:
            // __syncwarp does (compute-sanitizer's racecheck reported this pair).
            __syncwarp();
            if (lane == 0) {
                sM[warp] = m_new;
                sL[warp] = sL[warp] * alpha + sum;
                sA[warp] = alpha;
            }
        }
        __syncthreads();

        // Phase 3: acc = alpha acc + P V.
#pragma unroll
        for (int rr = 0; rr < SK_ROWS; ++rr) {
            const float a = sA[rr];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[rr][e] *= a;
        }
#pragma unroll
        for (int st0 = 0; st0 < ST3; st0 += SK_B3) {
            uint4 vr[SK_B3];
#pragma unroll
            for (int u = 0; u < SK_B3; ++u) {
                const int j = wk0 + (st0 + u) * KPV + kv;
                vr[u] = j < key_hi
                            ? __ldg(reinterpret_cast<const uint4*>(V + (long long)j * p.v_row_stride + vsl * 8))
                            : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < SK_B3; ++u) {
                float vf[8];
                fa_unpack8<DT>(vr[u], vf);
                const int jl = (st0 + u) * KPV + kv;
#pragma unroll
                for (int rr = 0; rr < SK_ROWS; ++rr) {
                    const float pr = sS[rr][warp * 32 + jl];
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[rr][e] = fmaf(pr, vf[e], acc[rr][e]);
                }
            }
        }
    }

    // Lanes with the same vsl hold the same dims for different keys: add them up.
#pragma unroll
    for (int o = LV; o < 32; o <<= 1)
#pragma unroll
        for (int rr = 0; rr < SK_ROWS; ++rr)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[rr][e] += __shfl_xor_sync(0xffffffffu, acc[rr][e], o);
    if (lane < LV) {
#pragma unroll
        for (int rr = 0; rr < SK_ROWS; ++rr) {
            float4* dst = reinterpret_cast<float4*>(&sAcc[warp][rr][lane * 8]);
            dst[0] = make_float4(acc[rr][0], acc[rr][1], acc[rr][2], acc[rr][3]);
            dst[1] = make_float4(acc[rr][4], acc[rr][5], acc[rr][6], acc[rr][7]);
        }
    }
    __syncthreads();

    const long long total = (long long)p.batch * p.heads * nq;
    for (int t = tid; t < SK_ROWS * D; t += SK_THREADS) {
        const int rr = t / D, c = t - rr * D;
        const int r = rc * SK_ROWS + rr;
        if (r >= nrows) continue;
        const int g = r / nq, i = r - g * nq, h = kvh * group + g;
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < SK_NW; ++w) o += sAcc[w][rr][c];
        const float L = sL[rr], M = sM[rr];
        const float out = L > 0.f ? o / L : 0.f;
        const float lse = L > 0.f ? (M + log2f(L)) * FA_LN2 : FA_NEG_INF;
        const long long row = ((long long)b * p.heads + h) * nq + i;
        if (p.num_splits == 1) {  // no split: this is the answer
            unsigned short* O = (unsigned short*)p.o + b * p.o_batch_stride + h * p.o_head_stride +
                                (long long)i * p.o_row_stride;
            O[c] = FaElem<DT>::from_float(out);
            if (c == 0 && p.lse != nullptr) p.lse[row] = lse;
        } else {
            ((float*)p.workspace[0])[((long long)split * total + row) * D + c] = out;
            if (c == 0) ((float*)p.workspace[1])[(long long)split * total + row] = lse;
        }
    }
}

template <int DT, int D>
__device__ __forceinline__ void splitkv_combine(const FaParams& p) {
    constexpr int NC = D / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long total = (long long)p.batch * p.heads * p.seqlen_q;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= total) return;
    const int S = p.num_splits;
    const float* plse = (const float*)p.workspace[1];
    const float* po = (const float*)p.workspace[0];

    float mx = FA_NEG_INF;
    for (int s = lane; s < S; s += 32) mx = fmaxf(mx, plse[(long long)s * total + row]);
    mx = fa_warp_max(mx);
    float lse = FA_NEG_INF;  // every split empty: the row saw no key
    if (mx != FA_NEG_INF) {
        float sum = 0.f;
        for (int s = lane; s < S; s += 32) sum += expf(plse[(long long)s * total + row] - mx);
        lse = mx + logf(fa_warp_sum(sum));
    }
    float acc[NC];
#pragma unroll
    for (int t = 0; t < NC; ++t) acc[t] = 0.f;
    if (lse != FA_NEG_INF) {
        for (int s = 0; s < S; ++s) {
            const float w = expf(plse[(long long)s * total + row] - lse);  // -inf -> 0
            if (w > 0.f) {  // false for NaN too; the same on every lane
                const float* o = po + ((long long)s * total + row) * D;
#pragma unroll
                for (int t = 0; t < NC; ++t) acc[t] = fmaf(w, o[lane + 32 * t], acc[t]);
            }
        }
    }
    const int i = (int)(row % p.seqlen_q);
    const long long bh = row / p.seqlen_q;
    const int h = (int)(bh % p.heads), b = (int)(bh / p.heads);
    unsigned short* O = (unsigned short*)p.o + b * p.o_batch_stride + h * p.o_head_stride +
                        (long long)i * p.o_row_stride;
#pragma unroll
    for (int t = 0; t < NC; ++t) O[lane + 32 * t] = FaElem<DT>::from_float(acc[t]);
    if (lane == 0 && p.lse != nullptr) p.lse[row] = lse;
}

#define SK_ENTRIES(SHORT, DT, D)                                                                \
    extern "C" __global__ void __launch_bounds__(SK_THREADS, 2) splitkv_partial_##SHORT##_d##D(FaParams p) { \
        splitkv_partial<DT, D>(p);                                                              \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(128) splitkv_combine_##SHORT##_d##D(FaParams p) { \
        splitkv_combine<DT, D>(p);                                                              \
    }
SK_ENTRIES(fp16, FA_DTYPE_FP16, 64)
SK_ENTRIES(fp16, FA_DTYPE_FP16, 128)
SK_ENTRIES(bf16, FA_DTYPE_BF16, 64)
SK_ENTRIES(bf16, FA_DTYPE_BF16, 128)
