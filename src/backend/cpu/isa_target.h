// Brackets for code compiled for a wider instruction set than the build's
// baseline (cpu_isa.h). Include every header first, then open the region:
// only the functions defined inside it (including templates and lambdas) may
// use the wider instructions, so nothing shared with the rest of the program
// - inline functions of the standard library or core/ - is ever emitted with
// instructions the baseline machine lacks. Callers reach these functions only
// after cpu_isa.h has found the instruction set.
#pragma once

#define DEEPINFER_AVX512_FEATURES "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"
#define DEEPINFER_AMX_FEATURES DEEPINFER_AVX512_FEATURES ",amx-tile,amx-int8"

#define DEEPINFER_STRINGIFY_PRAGMA(x) _Pragma(#x)

#if defined(__clang__)
#define DEEPINFER_ISA_BEGIN(features) \
  DEEPINFER_STRINGIFY_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define DEEPINFER_ISA_END _Pragma("clang attribute pop")
#else
// GCC 12 also reports its own AVX-512 intrinsics (which start from
// _mm512_undefined_*()) as reading uninitialised values once inlined: a false
// positive, silenced inside the region only.
#define DEEPINFER_ISA_BEGIN(features)                                                        \
  _Pragma("GCC push_options") DEEPINFER_STRINGIFY_PRAGMA(GCC target(features))               \
      _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
          _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DEEPINFER_ISA_END _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#endif
