// Entry point with the wrong signature.
#include "fa_harness.h"

extern "C" __global__ void wrong_signature_fp16(float* out, int n) {
    if (threadIdx.x < n) out[threadIdx.x] = 0.f;
}
