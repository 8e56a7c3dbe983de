import pathlib

# Writes the .cu files of this folder (run from anywhere): one honest kernel and the bad or
# cheating variants of it the submission tests use.
HERE = pathlib.Path(__file__).resolve().parent
HEADER = '''/* fa-harness manifest
name = "{name}"
description = "{desc}"
algorithm = "ideal"
min_compute_capability = "8.0"
compile_options = {opts}
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
entry = "{entry}"
grid = [{grid}, "heads", "batch"]
block = [128, 1, 1]
shared_mem = {smem}
*/
'''
BODY = r'''#include "fa_harness.h"

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

CHEAT_GLOBALS

extern "C" __global__ void ENTRY_SIGNATURE {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int i = blockIdx.x * 4 + warp, h = blockIdx.y, b = blockIdx.z;
    const bool active = i < p.seqlen_q;
    CHEAT_START
    if (active) {
        const int hk = h / (p.heads / p.kv_heads);
        const long long qo = b * p.q_batch_stride + h * p.q_head_stride + i * p.q_row_stride;
        const long long ko = b * p.k_batch_stride + hk * p.k_head_stride;
        const long long vo = b * p.v_batch_stride + hk * p.v_head_stride;
        const long long oo = b * p.o_batch_stride + h * p.o_head_stride + i * p.o_row_stride;
        float qr[8], acc[8];
        for (int c = 0; c < 8; ++c) {
            const int dim = lane + 32 * c;
            qr[c] = dim < p.head_dim ? ld_x(p.q, qo + dim, p.dtype) : 0.f;
            acc[c] = 0.f;
        }
        float m = __int_as_float(0xff800000u), l = 0.f;
        const int end = fa_key_end(p, b, i);
        for (int j = 0; j < end; ++j) {
            if (!fa_visible(p, b, i, j)) continue;  // uniform across the warp
            float s = 0.f;
            for (int c = 0; c < 8; ++c) {
                const int dim = lane + 32 * c;
                if (dim < p.head_dim) s += qr[c] * ld_x(p.k, ko + j * p.k_row_stride + dim, p.dtype);
            }
            for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
            s *= p.scale;
            const float mn = fmaxf(m, s);
            const float corr = expf(m - mn);  // m = -inf, mn finite: 0
            const float pj = expf(s - mn);
            l = l * corr + pj;
            for (int c = 0; c < 8; ++c) {
                const int dim = lane + 32 * c;
                if (dim < p.head_dim)
                    acc[c] = acc[c] * corr + pj * ld_x(p.v, vo + j * p.v_row_stride + dim, p.dtype);
            }
            m = mn;
        }
        CHEAT_BEFORE_STORE
        for (int c = 0; c < 8; ++c) {
            const int dim = lane + 32 * c;
            if (dim < p.head_dim) st_x(p.o, oo + dim, l > 0.f ? acc[c] / l : 0.f, p.dtype);
        }
        if (lane == 0 && p.lse)
            p.lse[(long long)(b * p.heads + h) * p.seqlen_q + i] =
                l > 0.f ? m + logf(l) : __int_as_float(0xff800000u);
        CHEAT_AFTER_STORE
    }
    CHEAT_END
}
'''
def make(fname, name, desc, *, entry="rowwarp", opts="[]", grid='"ceil_div(seqlen_q, rows_per_block)"',
         smem="0", sig="rowwarp(FaParams p)", globals_="", start="", before="", after="", end="",
         body_extra="", header_name=None):
    body = (BODY.replace("CHEAT_GLOBALS", globals_).replace("ENTRY_SIGNATURE", sig)
            .replace("CHEAT_START", start).replace("CHEAT_BEFORE_STORE", before)
            .replace("CHEAT_AFTER_STORE", after).replace("CHEAT_END", end))
    text = HEADER.format(name=name, desc=desc, entry=entry, opts=opts, grid=grid, smem=smem) + body + body_extra
    (HERE / fname).write_text(text)

make("good_rowwarp.cu", "good_rowwarp", "honest: one warp per query row")
# Rejected at validation (CPU):
make("syntax_error.cu", "syntax_error", "a missing semicolon", before="float broken = 1.f\n")
make("missing_entry.cu", "missing_entry", "manifest names an entry the source lacks", entry="not_defined")
make("wrong_signature.cu", "wrong_signature", "entry takes a second parameter besides FaParams",
     sig="rowwarp(FaParams p, int extra)")
make("system_include.cu", "system_include", "includes a system header",
     globals_="#include <stdio.h>")
make("huge_grid.cu", "huge_grid", "asks for 10^9 blocks", grid='"1000000000"')
make("huge_smem.cu", "huge_smem", "asks for more shared memory than the GPU has", smem='"300 * 1024"')
make("rdc_option.cu", "rdc_option", "asks for relocatable device code", opts='["-rdc=true"]')
make("dynamic_parallelism.cu", "dynamic_parallelism", "launches a kernel from the device",
     globals_='__global__ void side_work(FaParams p) { }',
     end='if (threadIdx.x == 0 && blockIdx.x == 0) side_work<<<1, 1>>>(p);')
make("redefine_check.cu", "redefine_check", "disables the signature check",
     globals_='#undef FA_CHECK_ENTRY\n#define FA_CHECK_ENTRY(x)')
# Valid code that must be caught when it runs (GPU):
make("loop_forever.cu", "loop_forever", "one warp spins forever",
     start="if (i == 0 && h == 0 && b == 0) { for (;;) { if (clock64() < 0) break; } }")
make("sleeps.cu", "sleeps", "sleeps in a __nanosleep loop far beyond any deadline",
     start="if (i == 0 && h == 0 && b == 0) { for (volatile int k = 0; k >= 0; k = 0) __nanosleep(1000000); }")
make("illegal_address.cu", "illegal_address", "writes through a bad pointer",
     start="if (i == 0 && lane == 0) { reinterpret_cast<float*>(0x8)[h] = 1.f; }")
make("write_past_output.cu", "write_past_output", "writes one row past the end of O",
     after="if (i == p.seqlen_q - 1 && lane == 0) st_x(p.o, oo + p.o_row_stride, 0.f, p.dtype);")
make("nan_output.cu", "nan_output", "writes a NaN into the output",
     after="if (i == p.seqlen_q / 2 && lane == 0) static_cast<unsigned short*>(p.o)[oo] = 0x7e00;")
make("partial_output.cu", "partial_output", "leaves every 64th row unwritten",
     before="if (i % 64 == 63) return;  // this warp never stores its row",
     after="",
     body_extra="")
make("modified_inputs.cu", "modified_inputs", "scribbles on q after reading it",
     after="if (lane == 0) const_cast<unsigned short*>(static_cast<const unsigned short*>(p.q))[qo] = 0;")
make("cached_output.cu", "cached_output", "skips the work when called again with the same buffers",
     globals_="__device__ unsigned long long g_key;\n__device__ unsigned int g_finished;",
     start="""const unsigned long long key = reinterpret_cast<unsigned long long>(p.q) ^
        (reinterpret_cast<unsigned long long>(p.o) << 1) ^ (unsigned long long)p.seqlen_q;
    if (*(volatile unsigned long long*)&g_key == key) return;  // "already computed\"""",
     end="""__syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned total = gridDim.x * gridDim.y * gridDim.z;
        if (atomicAdd(&g_finished, 1u) == total - 1) { g_key = key; g_finished = 0; }
    }""")
# Caught by compute-sanitizer before timing (GPU): the output is right almost always.
# The race must survive into the machine code: a value stored once and read back (a
# constant flag in shared memory, say) is folded by the compiler and races with nothing,
# so the planted bug is the classic one, a tile staged in shared memory without the
# barrier between the stores and the reads (tests/test_submit_corpus.py checks the PTX).
RACY_LOOP = r'''extern "C" __global__ void rowwarp(FaParams p) {
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
'''
racy_body = BODY[:BODY.index("CHEAT_GLOBALS")] + "#define TILE 16\n\n" + RACY_LOOP
(HERE / "racy_rows.cu").write_text(
    HEADER.format(name="racy_rows", desc="stages K/V tiles in shared memory without the "
                  "__syncthreads() between the stores and the reads", entry="rowwarp",
                  opts="[]", grid='"ceil_div(seqlen_q, rows_per_block)"', smem="0")
    + racy_body)
make("far_writer.cu", "far_writer", "writes one element 3 MiB past the end of O",
     after="if (i == 0 && h == 0 && b == 0 && lane == 0) "
           "static_cast<unsigned short*>(p.o)[oo + (3 << 20) / 2] = 0;")
