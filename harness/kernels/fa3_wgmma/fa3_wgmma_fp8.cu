// fa3_wgmma's FP8 pieces (compiled before fa3_wgmma.cu, whose forward uses them): e4m3
// Q, K and V (docs/fp8.md), one descale per tensor or per (batch entry, head).
//
// 8-bit wgmma reads both operands K-major. S = Q K^T is that already (Q's and K's rows
// are their head dims), but O += P V needs V^T, keys contiguous per column of V. V
// arrives by TMA as it is in memory (a row per key) into a staging slot, and three
// warps of the producer's warpgroup transpose it into the V^T slot the consumers read,
// 4 x 4 bytes at a time (byte permutes). P goes from the S accumulators to wgmma's A
// register fragment without any shuffle: within each 32-key step a thread's accumulators
// hold keys 2q, 2q+1, 2q+8, 2q+9 (+16) of its rows (q = lane % 4), where the A fragment
// wants the 4 consecutive columns 4q..4q+3 (+16); the sum over keys does not care which
// key a column stands for, so V^T's column 4q + j holds key 2q + (j & 1) + 8 (j >> 1)
// (+16 in the second half of the step): the transposers write that order, and P's
// fragment is its accumulators in their own order.
#include "fa_harness.h"

namespace fa3wg {

// FP8 (e4m3 A and B, fp32 D): k32 steps, both operands K-major (8-bit wgmma has no
// transpose), no imm-trans arguments. D (64 x N) = A (smem) * B (smem) [+ D], and
// D += A (registers: 4 words of 4 e4m3 each) * B (smem).
struct Mma8 {
__device__ __forceinline__ static void ss8_n128(float* d, unsigned long long da,
                                             unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(acc));
}
__device__ __forceinline__ static void rs8_n128(float* d, const unsigned* a,
                                             unsigned long long db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ static void rs8_n64(float* d, const unsigned* a,
                                             unsigned long long db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
};

// Four floats to four e4m3 bytes (x0 lowest), rounded to nearest (P is in [0, 1]).
__device__ __forceinline__ unsigned pack4_e4m3(float x0, float x1, float x2, float x3) {
    unsigned r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(r) : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
    return r;
}

// The key that column `pos` (0 .. BN - 1) of V^T holds: the P fragment's order (above).
__device__ __forceinline__ int fp8_key_of_column(int pos) {
    const int j = pos & 3, q = (pos >> 2) & 3;
    return (pos & ~15) + 2 * q + (j & 1) + 8 * (j >> 1);
}

// One tile's V^T from its staging copy, by the NT threads tt = 0 .. NT - 1: the staging
// slot is V as TMA wrote it (BN rows of D bytes: at D = 128 with the 128-byte swizzle,
// 16-byte chunk c of row r at chunk c ^ (r % 8); at D = 64 unswizzled); V^T is D rows of
// BN = 128 bytes with the 128-byte swizzle, so that the wgmma descriptors read it as they
// read K at d = 128. Each step moves a 4 x 4 block: 4 keys' words of 4 columns in, 4 words
// of 4 keys out (one per column), by byte permutes.
template <int D, int BN, int NT>
__device__ __forceinline__ void fp8_transpose_v(unsigned stage, unsigned vt, int tt) {
    static_assert(BN == 128 && (D == 128 || D == 64), "128 keys; rows of 64 or 128 bytes");
    constexpr int WORDS = D / 4;   // 4-byte words of a key's row
#pragma unroll 1
    for (int blk = tt; blk < (BN / 4) * WORDS; blk += NT) {
        const int j = blk % WORDS;      // the columns 4 j .. 4 j + 3 (consecutive lanes:
        const int p0 = 4 * (blk / WORDS);   // one key row's words, no bank conflict)
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int key = fp8_key_of_column(p0 + i);
            const unsigned a = D == 128 ? stage + key * 128 + ((((unsigned)j >> 2) ^ (key & 7)) << 4)
                                              + ((j & 3) << 2)
                                        : stage + key * D + 4 * j;
            asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w[i]) : "r"(a));
        }
        unsigned t01, t23, u01, u23, out[4];
        asm("prmt.b32 %0, %1, %2, 0x5140;\n" : "=r"(t01) : "r"(w[0]), "r"(w[1]));
        asm("prmt.b32 %0, %1, %2, 0x5140;\n" : "=r"(t23) : "r"(w[2]), "r"(w[3]));
        asm("prmt.b32 %0, %1, %2, 0x7362;\n" : "=r"(u01) : "r"(w[0]), "r"(w[1]));
        asm("prmt.b32 %0, %1, %2, 0x7362;\n" : "=r"(u23) : "r"(w[2]), "r"(w[3]));
        asm("prmt.b32 %0, %1, %2, 0x5410;\n" : "=r"(out[0]) : "r"(t01), "r"(t23));
        asm("prmt.b32 %0, %1, %2, 0x7632;\n" : "=r"(out[1]) : "r"(t01), "r"(t23));
        asm("prmt.b32 %0, %1, %2, 0x5410;\n" : "=r"(out[2]) : "r"(u01), "r"(u23));
        asm("prmt.b32 %0, %1, %2, 0x7632;\n" : "=r"(out[3]) : "r"(u01), "r"(u23));
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int n = 4 * j + r;   // V's column: V^T's row
            const unsigned a = vt + n * 128 + ((((unsigned)p0 >> 4) ^ (n & 7)) << 4) + (p0 & 15);
            asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(a), "r"(out[r]) : "memory");
        }
    }
}

}  // namespace fa3wg
