// fa3_wgmma backward: the FA2 loop order (outer K/V, inner Q) on Hopper's wgmma.
//
// Concatenated after fa3_wgmma.cu (the manifest lists both): it uses that file's wgmma
// wrappers, descriptors, TMA and mbarrier helpers. Three launches: bwd_pre (D =
// rowsum(dO * O), the fp32 dQ accumulator zeroed), bwd_main below, bwd_post (dQ = scale *
// accumulator, read in the accumulator's own order DqIndex).
//
// bwd_main: one CTA per block of 128 keys of one K/V head, two warpgroups of 64 keys each.
// K and V stay in shared memory; the CTA walks every query head of its GQA group (dK and
// dV are summed over the group in registers and written once) and every Q block of BM
// rows that sees its keys (BM = 64 at d = 128, 128 at d = 64, so a Q or dO tile is 16 KB).
// One thread has the Tensor Memory Accelerator bring K and V once and Q and dO per step
// (the [[backward.tensor_map]] tables; 128-byte swizzle, two stages, mbarriers), LSE and D
// come by plain loads into shared memory. Per Q block, each warpgroup:
//     S^T  = K_w Q^T,  dP^T = V_w dO^T        wgmma, both operands K-major in shared memory
//     P^T  = exp2(S^T scale log2 e - LSE log2 e),  dS^T = P^T (dP^T - D)   in registers
//     dV  += P^T dO,   dK  += dS^T Q           wgmma, P^T / dS^T as register A-fragments
//                                              (the accumulator layout), dO / Q MN-major
//     dQ  += dS K      dS^T goes to shared memory (swizzled); after a barrier each
//                      warpgroup multiplies a 64 x 64 part of dQ over all 128 keys (both
//                      operands MN-major), stores it to shared memory and one thread adds
//                      it to the fp32 accumulator with a bulk reduction (the copy engine
//                      adds in L2; other CTAs own the other keys of these rows).
// st.shared writes through the generic proxy and wgmma and the bulk copies read through
// the async proxy: the writers run fence.proxy.async before the barrier that publishes.
// The tiles come by TMA rather than cp.async: a fence also waits for the thread's own
// cp.async copies in flight, which put each step's prefetch on the critical path (on the
// H200, d = 128, N = 16k: 312 TFLOP/s with cp.async tiles, 454 with TMA).
// Masks: none, causal (both alignments via causal_offset; a CTA starts at the first Q block
// that sees its keys), key padding. Keys and rows past the end arrive as zeros (the tensor
// maps' bounds: no NaN from stale memory reaches dP). A fully masked row has LSE = -inf, read
// as +inf so that P = 0: its dQ stays 0 and it adds nothing to dK / dV. A row past the end
// reads LSE = D = 0 with Q = dO = 0: P = 1 there, but dP = dS = 0 and dO = 0 add nothing.
// The dQ additions land in the order CTAs finish: not bitwise deterministic.
namespace fa3wg {

constexpr int kBwdThreads = 256;
constexpr int BNB = 128;  // keys per CTA

template <int D> struct BwdTile { static constexpr int BM = 8192 / D; };

__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// dst[0 .. bytes) += src[0 .. bytes) (fp32), by the copy engine, reduced in L2.
__device__ __forceinline__ void bulk_reduce_add(float* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's bulk operations still read their shared-memory source.
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}

// The fp32 dQ accumulator's order: per (batch, head), 64-row blocks; per block, 64-column
// parts (d / 64 of them); a part (64 x 64, 16 KB) is laid out as a warpgroup's wgmma
// accumulators leave it: thread (warp, lane) owns 32 consecutive floats, its register
// 4t + 2rh + e (row 16 warp + lane / 4 + 8 rh, column 8t + 2 (lane % 4) + e), its 16-byte
// chunks in the order t ^ (lane % 8) so that the stores into shared memory never conflict.
// A part is then one contiguous copy: the bulk reduction adds it as it is.
struct DqIndex {
    int nq;
    int nblk;  // 2 ceil(nq / 128): a d = 64 step covers two blocks, also past the end
    template <int D> __device__ __forceinline__ long long at(long long row, int c) const {
        const long long bh = row / nq;
        const int i = (int)(row % nq);
        const int r = i & 63;
        const int cc = c & 63;
        const int lane = (r & 7) * 4 + ((cc >> 1) & 3);
        const int t = cc >> 3;
        const long long part = (bh * nblk + (i >> 6)) * (D / 64) + (c >> 6);
        return part * 4096 + ((r >> 4) * 32 + lane) * 32 + ((t ^ (lane & 7)) << 2) +
               2 * ((r >> 3) & 1) + (cc & 1);
    }
};
__device__ __forceinline__ DqIndex dq_index(const FaParams& p) {
    return DqIndex{p.seqlen_q, 2 * ((p.seqlen_q + 127) / 128)};
}

// The first and last launches move every element of O, dO, dQ and the fp32 accumulator
// once: at N = 1k they are a tenth of the backward's time, so they use 16-byte accesses
// in the order memory holds them. (The shared fa_bwd_pre / fa_bwd_post walk rows, which
// touches DqIndex's order 4 bytes at a time, a quarter of each 32-byte sector.)
//
// bwd_pre: D / 8 threads per row, each one 16-byte load of O and of dO (1024 / D rows per
// 128-thread block); the block then zeroes its contiguous share of the whole accumulator
// (padding blocks too) by float4 stores. Rows not 16-byte aligned take the scalar path.
template <int D, bool BF16>
__device__ __forceinline__ void bwd_pre(const FaParams& p) {
    constexpr int DT = BF16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
    constexpr int TPR = D / 8;
    constexpr int RPB = 128 / TPR;
    const int tid = threadIdx.x;
    const long long rows = (long long)p.batch * p.heads * p.seqlen_q;
    const long long row = (long long)blockIdx.x * RPB + tid / TPR;
    const int c = (tid % TPR) * 8;
    float acc = 0.f;
    if (row < rows) {
        const int i = (int)(row % p.seqlen_q);
        const int h = (int)((row / p.seqlen_q) % p.heads);
        const int b = (int)(row / ((long long)p.seqlen_q * p.heads));
        const unsigned short* o = (const unsigned short*)p.o + b * p.o_batch_stride +
                                  h * p.o_head_stride + (long long)i * p.o_row_stride + c;
        const unsigned short* dO = (const unsigned short*)p.dout + b * p.do_batch_stride +
                                   h * p.do_head_stride + (long long)i * p.do_row_stride + c;
        if ((((unsigned long long)o | (unsigned long long)dO) & 15ull) == 0) {
            float fo[8], fd[8];
            fa_unpack8<DT>(*(const uint4*)o, fo);
            fa_unpack8<DT>(*(const uint4*)dO, fd);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc += fo[e] * fd[e];
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) acc += FaElem<DT>::to_float(o[e]) * FaElem<DT>::to_float(dO[e]);
        }
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (row < rows && tid % TPR == 0) ((float*)p.workspace[0])[row] = acc;

    const DqIndex ix = dq_index(p);
    const long long n4 = (long long)p.batch * p.heads * ix.nblk * 64 * D / 4;
    const long long per = (n4 + gridDim.x - 1) / gridDim.x;
    const long long z1 = min(((long long)blockIdx.x + 1) * per, n4);
    float4* acc4 = (float4*)p.workspace[1];
    for (long long k = (long long)blockIdx.x * per + tid; k < z1; k += 128)
        acc4[k] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// bwd_post: one block per 64 x 64 part of the accumulator (16 KB, contiguous), read as
// float4 in memory order, put back in (row, column) order in shared memory, then written
// as dQ rows by 16-byte stores. The part's float4 k belongs to the wgmma thread T = k / 8
// (warp T / 32, lane T % 32), chunk t = (k % 8) ^ (lane % 8): rows 16 warp + lane / 4 (+ 8
// for .z .w), columns 8t + 2 (lane % 4) (+ 1 for .y .w), as DqIndex lays them.
template <int D, bool BF16>
__device__ __forceinline__ void bwd_post(const FaParams& p) {
    constexpr int DT = BF16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
    __shared__ __align__(16) float tile[64][68];  // 68: rows 16-byte aligned, banks spread
    const int tid = threadIdx.x;
    const int blk = blockIdx.x / (D / 64);
    const int cpart = blockIdx.x % (D / 64);
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const DqIndex ix = dq_index(p);
    const long long part = (((long long)b * p.heads + h) * ix.nblk + blk) * (D / 64) + cpart;
    const float4* src = (const float4*)((const float*)p.workspace[1] + part * 4096);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int k = tid + 128 * j;
        const float4 v = src[k];
        const int ln = (k >> 3) & 31;
        const int r0 = 16 * (k >> 8) + (ln >> 2);
        const int c0 = 8 * ((k & 7) ^ (ln & 7)) + 2 * (ln & 3);
        *(float2*)&tile[r0][c0] = make_float2(v.x, v.y);
        *(float2*)&tile[r0 + 8][c0] = make_float2(v.z, v.w);
    }
    __syncthreads();
    unsigned short* dq = (unsigned short*)p.dq + b * p.dq_batch_stride + h * p.dq_head_stride +
                         cpart * 64;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int q = tid + 128 * j;
        const int r = q >> 3;
        const int c8 = (q & 7) * 8;
        const int row = blk * 64 + r;
        if (row >= p.seqlen_q) continue;
        const float4 a = *(const float4*)&tile[r][c8];
        const float4 e = *(const float4*)&tile[r][c8 + 4];
        unsigned short* dst = dq + (long long)row * p.dq_row_stride + c8;
        if (((unsigned long long)dst & 15ull) == 0) {
            *(uint4*)dst = make_uint4(pack2<BF16>(a.x * p.scale, a.y * p.scale),
                                      pack2<BF16>(a.z * p.scale, a.w * p.scale),
                                      pack2<BF16>(e.x * p.scale, e.y * p.scale),
                                      pack2<BF16>(e.z * p.scale, e.w * p.scale));
        } else {
            const float f[8] = {a.x, a.y, a.z, a.w, e.x, e.y, e.z, e.w};
#pragma unroll
            for (int u = 0; u < 8; ++u) dst[u] = FaElem<DT>::from_float(f[u] * p.scale);
        }
    }
}

template <int D, bool BF16>
__device__ __forceinline__ void bwd_main(const FaParams& p) {
    using M = Mma<BF16>;
    constexpr int BM = BwdTile<D>::BM;
    constexpr unsigned KV_BYTES = BNB * D * 2;
    constexpr unsigned QS_BYTES = BM * D * 2;
    constexpr unsigned DS_BYTES = BNB * BM * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = smem_u32(smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    const unsigned sK = base;
    const unsigned sV = sK + KV_BYTES;
    const unsigned sQ0 = sV + KV_BYTES;        // 2 stages
    const unsigned sdO0 = sQ0 + 2 * QS_BYTES;  // 2 stages
    const unsigned sDS = sdO0 + 2 * QS_BYTES;
    // Two 16 KB dQ parts per warpgroup (double-buffered: one may still be read by the
    // previous step's bulk reduction).
    const unsigned sDQ0 = sDS + DS_BYTES;
    // Per stage: BM values of LSE log2(e), BM of D.
    const unsigned sStat = sDQ0 + 4 * 16384;
    float* stat_w = (float*)(smem_raw + (sStat - raw));
    const float* stat = stat_w;
    // mbarriers: K and V landed; stage 0 and stage 1 (Q and dO) landed.
    const unsigned bar_kv = sStat + 16 * BM;
    const unsigned bar_st = bar_kv + 8;
    constexpr unsigned kSmem = 2 * KV_BYTES + 4 * QS_BYTES + DS_BYTES + 4 * 16384 + 16 * BM + 24 + 1024;
    if (fa_dynamic_smem_bytes() < kSmem) __trap();  // the manifest asked for too little

    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int warp = (tid >> 5) & 3;
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

    // Queries that see any key of this block: i + causal_offset >= n0.
    int m_begin = causal ? max(0, n0 - p.causal_offset) : 0;
    m_begin = (m_begin / BM) * BM;
    const int n_m = (n0 < klimit && m_begin < p.seqlen_q) ? (p.seqlen_q - m_begin + BM - 1) / BM : 0;
    const int total = n_m * group;

    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

    // The operand tiles of this warpgroup's keys, and its part of dQ: a 64 x 64 block of
    // (rows mw, columns nw) over all 128 keys.
    const unsigned sKw = sK + wg * (64 * 128);
    const unsigned sVw = sV + wg * (64 * 128);
    const int mw = BM == 128 ? wg : 0;
    const int nw = BM == 128 ? 0 : wg;

    if (total > 0) {
        const float* delta = (const float*)p.workspace[0];
        float* dqacc = (float*)p.workspace[1];
        const char* maps = (const char*)p.tensor_maps;  // Q, K, V, dO (manifest order)
        if (tid == 0) {
            mbar_init(bar_kv, 1);
            mbar_init(bar_st, 1);
            mbar_init(bar_st + 8, 1);
        }
        __syncthreads();
        // The copies of one (ROWS x D) tile: one TMA box per 64-column half.
        auto tma_tile = [&](unsigned dst, int map, unsigned bar, int rows, int row0, int head) {
#pragma unroll
            for (int half = 0; half < D / 64; ++half)
                tma_load(dst + half * rows * 128, maps + 128 * map, bar, half * 64, row0, head, b);
        };
        // Q and dO of query head h, rows m0 .., into stage st (one thread issues them).
        auto load_step = [&](int h, int m0, int st) {
            mbar_expect_tx(bar_st + 8 * st, 2 * QS_BYTES);
            tma_tile(sQ0 + st * QS_BYTES, 0, bar_st + 8 * st, BM, m0, h);
            tma_tile(sdO0 + st * QS_BYTES, 3, bar_st + 8 * st, BM, m0, h);
        };
        // LSE and D of those rows by plain loads: thread i < BM of warpgroup 0 loads row i's
        // LSE, of warpgroup 1 its D. At d = 128 the load is issued a step ahead and its
        // value stored into the stage only at the end of that step, so its latency hides
        // under the step's matmuls instead of stalling the warps that issued it (1-7%
        // faster on the H200). At d = 64 (BM = 128: half the matmul work per row) that was
        // 8-11% slower, so there the value is stored as soon as it is loaded
        // (load_stats). Rows past the end read as 0 (their Q and dO are zeros: P = 1,
        // dS = 0, nothing is added).
        constexpr bool kDeferStat = D == 128;
        auto load_stat = [&](int h, int m0) -> float {
            const int i = tid & 127;
            const int row = m0 + i;
            if (i >= BM || row >= p.seqlen_q) return 0.f;
            const long long at = ((long long)b * p.heads + h) * p.seqlen_q + row;
            return wg == 0 ? p.lse[at] : delta[at];
        };
        auto store_stat = [&](float v, int st) {
            const int i = tid & 127;
            if (i >= BM) return;
            // LSE in the exp2 domain; a fully masked row (-inf) subtracts +inf: P = 0.
            if (wg == 0) v = v == neg_inf() ? __int_as_float(0x7f800000) : v * 1.4426950408889634f;
            stat_w[st * 2 * BM + wg * BM + i] = v;
        };
        auto load_stats = [&](int h, int m0, int st) {
            const int i = tid & 127;
            if (i < BM) {
                const int row = m0 + i;
                const long long at = ((long long)b * p.heads + h) * p.seqlen_q + row;
                float v = row < p.seqlen_q ? (wg == 0 ? p.lse[at] : delta[at]) : 0.f;
                // LSE in the exp2 domain; a fully masked row (-inf) subtracts +inf: P = 0.
                if (wg == 0) v = v == neg_inf() ? __int_as_float(0x7f800000) : v * 1.4426950408889634f;
                stat_w[st * 2 * BM + wg * BM + i] = v;
            }
        };
        // Step it is (query head h, rows m0 ..): the Q blocks of one head, then the next head.
        // Kept as counters (a division per step costs registers the accumulators need).
        int h = hk * group, m0 = m_begin;
        if (tid == 0) {
            mbar_expect_tx(bar_kv, 2 * KV_BYTES);
            tma_tile(sK, 1, bar_kv, BNB, n0, hk);
            tma_tile(sV, 2, bar_kv, BNB, n0, hk);
            load_step(h, m0, 0);
        }
        if constexpr (kDeferStat) store_stat(load_stat(h, m0), 0);
        else load_stats(h, m0, 0);
        mbar_wait(bar_kv, 0);

        for (int it = 0; it < total; ++it) {
            const int st = it & 1;
            // Stage st has landed; every thread is past step it - 1, so stage st ^ 1, the
            // dS^T tile and this step's dQ part are free.
            mbar_wait(bar_st + 8 * st, (unsigned)(it >> 1) & 1u);
            if ((tid & 127) == 0) bulk_wait_read<1>();  // step it - 2's dQ part is read
            __syncthreads();
            int h_next = h, m_next = m0 + BM;
            if (m_next >= p.seqlen_q) { m_next = m_begin; ++h_next; }
            const bool more = it + 1 < total;
            if (more && tid == 0) load_step(h_next, m_next, st ^ 1);

            const unsigned sQ = sQ0 + st * QS_BYTES;
            const unsigned sdO = sdO0 + st * QS_BYTES;
            const float* lse2 = stat + st * 2 * BM;
            const float* del = lse2 + BM;

            float s[BM / 2], dp[BM / 2];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const unsigned ka = sKw + (kk >> 2) * (BNB * 128) + (kk & 3) * 32;
                const unsigned qb = sQ + (kk >> 2) * (BM * 128) + (kk & 3) * 32;
                if constexpr (BM == 64) M::ss_n64(s, sw128_desc(ka, 16), sw128_desc(qb, 16), kk > 0);
                else M::ss_n128(s, sw128_desc(ka, 16), sw128_desc(qb, 16), kk > 0);
            }
            wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const unsigned va = sVw + (kk >> 2) * (BNB * 128) + (kk & 3) * 32;
                const unsigned ob = sdO + (kk >> 2) * (BM * 128) + (kk & 3) * 32;
                if constexpr (BM == 64) M::ss_n64(dp, sw128_desc(va, 16), sw128_desc(ob, 16), kk > 0);
                else M::ss_n128(dp, sw128_desc(va, 16), sw128_desc(ob, 16), kk > 0);
            }
            wgmma_commit();
            // The next step's LSE or D into stage st ^ 1 (at d = 128 stored at the end of
            // this step).
            [[maybe_unused]] float stat_next = 0.f;
            if constexpr (kDeferStat) stat_next = more ? load_stat(h_next, m_next) : 0.f;
            else if (more) load_stats(h_next, m_next, st ^ 1);

            // P^T while dP^T still runs. Key j is visible to query i iff j < klimit and
            // (causal) j <= i + causal_offset.
            wgmma_wait<1>();
#pragma unroll
            for (int i = 0; i < BM / 2; ++i) reg_fence(s[i]);
            const int key0 = n0 + wg * 64 + warp * 16 + g;
            const bool need_mask = (n0 + BNB > klimit) || (causal && n0 + BNB - 1 > m0 + p.causal_offset);
#pragma unroll
            for (int t = 0; t < BM / 8; ++t) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = key0 + ((e >> 1) << 3);
                    const int qi = t * 8 + q4 * 2 + (e & 1);
                    float pv = exp2f(fmaf(s[4 * t + e], p.scale_log2, -lse2[qi]));
                    if (need_mask && (key >= klimit || (causal && key > m0 + qi + p.causal_offset)))
                        pv = 0.f;
                    s[4 * t + e] = pv;
                }
            }
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < BM / 2; ++i) reg_fence(dp[i]);
            unsigned pf[BM / 16][4], dsf[BM / 16][4];
#pragma unroll
            for (int t = 0; t < BM / 8; ++t) {
                const int qi = t * 8 + q4 * 2;
                const float d0 = s[4 * t] * (dp[4 * t] - del[qi]);
                const float d1 = s[4 * t + 1] * (dp[4 * t + 1] - del[qi + 1]);
                const float d2 = s[4 * t + 2] * (dp[4 * t + 2] - del[qi]);
                const float d3 = s[4 * t + 3] * (dp[4 * t + 3] - del[qi + 1]);
                pf[t >> 1][(t & 1) * 2] = pack2<BF16>(s[4 * t], s[4 * t + 1]);
                pf[t >> 1][(t & 1) * 2 + 1] = pack2<BF16>(s[4 * t + 2], s[4 * t + 3]);
                dsf[t >> 1][(t & 1) * 2] = pack2<BF16>(d0, d1);
                dsf[t >> 1][(t & 1) * 2 + 1] = pack2<BF16>(d2, d3);
            }
            // dS^T[key][query] for the dQ matmul: row = key (128 bytes = 64 queries per
            // half), the pair of queries 8t + 2q4 in chunk t % 8, swizzled by the row.
            {
                const int kr = wg * 64 + warp * 16 + g;
#pragma unroll
                for (int t = 0; t < BM / 8; ++t) {
                    const unsigned a = sDS + (t >> 3) * (BNB * 128) + kr * 128 +
                                       (((t & 7) ^ (kr & 7)) << 4) + 4 * q4;
                    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(a), "r"(dsf[t >> 1][(t & 1) * 2]));
                    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(a + 8 * 128), "r"(dsf[t >> 1][(t & 1) * 2 + 1]));
                }
            }
            // dV += P^T dO, dK += dS^T Q (issued; they run under the barrier and the dQ).
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk) {
                const unsigned ob = sdO + kk * (16 * 128);
                if constexpr (D == 128) M::rs_n128(dv, pf[kk], sw128_desc(ob, BM * 128));
                else M::rs_n64(dv, pf[kk], sw128_desc(ob, BM * 128));
            }
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk) {
                const unsigned qb = sQ + kk * (16 * 128);
                if constexpr (D == 128) M::rs_n128(dk, dsf[kk], sw128_desc(qb, BM * 128));
                else M::rs_n64(dk, dsf[kk], sw128_desc(qb, BM * 128));
            }
            wgmma_commit();
            fence_proxy_async();
            asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the whole dS^T tile is written

            float dq[32];
#pragma unroll
            for (int kk = 0; kk < BNB / 16; ++kk) {
                const unsigned da = sDS + mw * (BNB * 128) + kk * (16 * 128);
                const unsigned kb = sK + nw * (BNB * 128) + kk * (16 * 128);
                M::ss_n64_tt(dq, sw128_desc(da, BNB * 128), sw128_desc(kb, BNB * 128), kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 32; ++i) reg_fence(dq[i]);
#pragma unroll
            for (int i = 0; i < D / 2; ++i) { reg_fence(dk[i]); reg_fence(dv[i]); }
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
                for (int e = 0; e < 4; ++e) { reg_fence_u(pf[kk][e]); reg_fence_u(dsf[kk][e]); }

            // This warpgroup's 64 x 64 part of dQ into shared memory in the accumulator
            // order (DqIndex), then added to the accumulator by one bulk reduction. Rows
            // past the end add zeros to the padding of the last block.
            {
                const unsigned buf = sDQ0 + (wg * 2 + st) * 16384 + (tid & 127) * 128;
#pragma unroll
                for (int t = 0; t < 8; ++t)
                    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n"
                                 :: "r"(buf + ((t ^ (lane & 7)) << 4)), "f"(dq[4 * t]),
                                    "f"(dq[4 * t + 1]), "f"(dq[4 * t + 2]), "f"(dq[4 * t + 3]));
                fence_proxy_async();
                if (wg == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");
                else asm volatile("bar.sync 3, 128;\n" ::: "memory");
                if ((tid & 127) == 0) {
                    const DqIndex ix = dq_index(p);
                    const long long part = ((((long long)b * p.heads + h) * ix.nblk + (m0 >> 6) + mw) *
                                            (D / 64) + nw);
                    bulk_reduce_add(dqacc + part * 4096, sDQ0 + (wg * 2 + st) * 16384, 16384);
                }
            }
            if constexpr (kDeferStat) {
                if (more) store_stat(stat_next, st ^ 1);
            }
            h = h_next;
            m0 = m_next;
        }
        if ((tid & 127) == 0) bulk_wait_read<0>();  // shared memory outlives the copies
    }

    // dK (times the softmax scale) and dV of this warpgroup's keys, summed over the group.
    char* dkg = (char*)p.dk + 2 * (b * p.dk_batch_stride + hk * p.dk_head_stride);
    char* dvg = (char*)p.dv + 2 * (b * p.dv_batch_stride + hk * p.dv_head_stride);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = n0 + wg * 64 + warp * 16 + g + r * 8;
        if (key >= p.seqlen_k) continue;
        unsigned* krow = (unsigned*)(dkg + 2 * (long long)key * p.dk_row_stride);
        unsigned* vrow = (unsigned*)(dvg + 2 * (long long)key * p.dv_row_stride);
#pragma unroll
        for (int t = 0; t < D / 8; ++t) {
            krow[t * 4 + q4] = pack2<BF16>(dk[4 * t + 2 * r] * p.scale, dk[4 * t + 2 * r + 1] * p.scale);
            vrow[t * 4 + q4] = pack2<BF16>(dv[4 * t + 2 * r], dv[4 * t + 2 * r + 1]);
        }
    }
}

}  // namespace fa3wg

#define FA3WG_BWD_ENTRIES(SUF, D, BF16)                                                      \
    extern "C" __global__ void __launch_bounds__(128) fa3_wgmma_bwd_pre_##SUF(FaParams p) { \
        fa3wg::bwd_pre<D, BF16>(p);                                                          \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(fa3wg::kBwdThreads, 1)                      \
        fa3_wgmma_bwd_main_##SUF(FaParams p) {                                               \
        fa3wg::bwd_main<D, BF16>(p);                                                         \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(128) fa3_wgmma_bwd_post_##SUF(FaParams p) { \
        fa3wg::bwd_post<D, BF16>(p);                                                         \
    }

FA3WG_BWD_ENTRIES(fp16_d64, 64, false)
FA3WG_BWD_ENTRIES(fp16_d128, 128, false)
FA3WG_BWD_ENTRIES(bf16_d64, 64, true)
FA3WG_BWD_ENTRIES(bf16_d128, 128, true)
