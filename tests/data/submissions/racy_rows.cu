/* fa-harness manifest
name = "racy_rows"
description = "stages K/V tiles in shared memory without the __syncthreads() between the stores and the reads"
algorithm = "ideal"
min_compute_capability = "8.0"
compile_options = []
deterministic = true

[supports]
dtypes = ["float16", "bfloat16"]
head_dims = "any"
max_head_dim = 256
masks = ["none", "causal_br", "causal_tl", "key_padding", "random"]
gqa = true
writes_lse = true
masked_lse = "-inf"

[tiles]
rows_per_block = 4

[[launch]]
entry = "rowwarp"
grid = ["ceil_div(seqlen_q, rows_per_block)", "heads", "batch"]
block = [128, 1, 1]
shared_mem = 0
*/
#include "fa_harness.h"

// One warp per query row: each lane keeps head-dim elements lane, lane + 32, ... of q and
// of the output accumulator; scores are reduced across the warp; online softmax with the
// -inf guard (a row whose running max is still -inf never computes exp(-inf + inf)).
// Conversions are inline PTX so that only fa_harness.h is needed.
__device__ __forceinline__ float ld_x(const void* base, long long i, int dtype) {
    unsigned short h = static_cast<const unsigned short*>(base)[i];
    if (dtype == FA_DTYPE_BF16) return __uint_as_float(static_cast<unsigned>(h) << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ void st_x(void* base, long long i, float x, int dtype) {
    unsigned short h;
    if (dtype == FA_DTYPE_BF16) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    static_cast<unsigned short*>(base)[i] = h;
}

#define TILE 16

extern "C" __global__ void rowwarp(FaParams p) {
    // The block's four warps (one query row each) stage K and V in shared memory, TILE
    // keys at a time, every thread storing a slice of each key row; then every warp reads
    // whole rows. The __syncthreads() between the stores and the reads is missing (the
    // one before a tile is overwritten is kept): a warp that runs ahead reads parts of
    // key rows that another warp has not stored yet, stale from the previous tile.
    __shared__ unsigned short sk[TILE * 256], sv[TILE * 256];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int i = blockIdx.x * 4 + warp, h = blockIdx.y, b = blockIdx.z;
    const bool active = i < p.seqlen_q;
    const int d = p.head_dim;
    const int hk = h / (p.heads / p.kv_heads);
    const long long qo = b * p.q_batch_stride + h * p.q_head_stride + (long long)i * p.q_row_stride;
    const long long ko = b * p.k_batch_stride + hk * p.k_head_stride;
    const long long vo = b * p.v_batch_stride + hk * p.v_head_stride;
    const long long oo = b * p.o_batch_stride + h * p.o_head_stride + (long long)i * p.o_row_stride;
    float qr[8], acc[8];
    for (int c = 0; c < 8; ++c) {
        const int dim = lane + 32 * c;
        qr[c] = active && dim < d ? ld_x(p.q, qo + dim, p.dtype) : 0.f;
        acc[c] = 0.f;
    }
    float m = __int_as_float(0xff800000u), l = 0.f;
    const int end = active ? fa_key_end(p, b, i) : 0;
    // The block's last row sees the most keys (causal ends grow with the row): every
    // thread runs the same number of tiles, so the barrier below is reached by all.
    const int block_end = fa_key_end(p, b, min(blockIdx.x * 4 + 3, p.seqlen_q - 1));
    for (int t0 = 0; t0 < block_end; t0 += TILE) {
        __syncthreads();  // no warp still reads the previous tile
        for (int e = threadIdx.x; e < TILE * d; e += blockDim.x) {
            const int r = e / d, dim = e % d;
            if (t0 + r < p.seqlen_k) {
                sk[r * d + dim] = static_cast<const unsigned short*>(p.k)[ko + (long long)(t0 + r) * p.k_row_stride + dim];
                sv[r * d + dim] = static_cast<const unsigned short*>(p.v)[vo + (long long)(t0 + r) * p.v_row_stride + dim];
            }
        }
        // (the missing __syncthreads())
        const int tend = min(TILE, end - t0);
        for (int r = 0; r < tend; ++r) {
            const int j = t0 + r;
            if (!fa_visible(p, b, i, j)) continue;  // uniform across the warp
            float s = 0.f;
            for (int c = 0; c < 8; ++c) {
                const int dim = lane + 32 * c;
                if (dim < d) s += qr[c] * ld_x(sk, r * d + dim, p.dtype);
            }
            for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
            s *= p.scale;
            const float mn = fmaxf(m, s);
            const float corr = expf(m - mn);
            const float pj = expf(s - mn);
            l = l * corr + pj;
            for (int c = 0; c < 8; ++c) {
                const int dim = lane + 32 * c;
                if (dim < d) acc[c] = acc[c] * corr + pj * ld_x(sv, r * d + dim, p.dtype);
            }
            m = mn;
        }
    }
    if (!active) return;
    for (int c = 0; c < 8; ++c) {
        const int dim = lane + 32 * c;
        if (dim < d) st_x(p.o, oo + dim, l > 0.f ? acc[c] / l : 0.f, p.dtype);
    }
    if (lane == 0 && p.lse)
        p.lse[(long long)(b * p.heads + h) * p.seqlen_q + i] =
            l > 0.f ? m + logf(l) : __int_as_float(0xff800000u);
}
