// A syntax error on line 6.
#include "fa_harness.h"

extern "C" __global__ void does_not_compile_fp16(FaParams p) {
    float x = 1.0f
    int y = 2;
    ((float*)p.o)[0] = x + y;
}
