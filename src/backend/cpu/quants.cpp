#include "backend/cpu/quants.h"

#include <array>
#include <string>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/quants_internal.h"
#include "core/error.h"

namespace deepinfer::cpu {

namespace {

using namespace quants;

constexpr size_t kNumDTypes = static_cast<size_t>(DType::Count);
using KernelTable = std::array<QuantKernels, kNumDTypes>;

// Dequantisation of the formats prefill dequantises most, per level (every
// level gives the same bits; the rest are the shared portable loops).
struct Dequantizers {
  DequantizeFn q4_0 = dequantize_q4_0, q4_1 = dequantize_q4_1, q5_0 = dequantize_q5_0, q5_1 = dequantize_q5_1,
               q8_0 = dequantize_q8_0, q4_k = dequantize_q4_k, q5_k = dequantize_q5_k, q6_k = dequantize_q6_k,
               f8_b64 = dequantize_f8_b64;
};

// What differs between instruction sets.
struct IsaKernels {
  QuantizeFn quantize_q8_1, quantize_q8_k;
  DotFn f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, f8_b64;
  Dequantizers deq{};
};

KernelTable make_table(const IsaKernels& k) {
  KernelTable t{};
  auto set = [&](DType w, DType act, DequantizeFn deq, QuantizeFn quant, DotFn dot) {
    t[static_cast<size_t>(w)] = QuantKernels{w, act, deq, quant, dot};
  };
  set(DType::F32, DType::F32, dequantize_f32, nullptr, k.f32);
  set(DType::F16, DType::F32, dequantize_f16, nullptr, k.f16);
  set(DType::BF16, DType::F32, dequantize_bf16, nullptr, k.bf16);
  set(DType::Q4_0, DType::Q8_1, k.deq.q4_0, k.quantize_q8_1, k.q4_0);
  set(DType::Q4_1, DType::Q8_1, k.deq.q4_1, k.quantize_q8_1, k.q4_1);
  set(DType::Q5_0, DType::Q8_1, k.deq.q5_0, k.quantize_q8_1, k.q5_0);
  set(DType::Q5_1, DType::Q8_1, k.deq.q5_1, k.quantize_q8_1, k.q5_1);
  set(DType::Q8_0, DType::Q8_1, k.deq.q8_0, k.quantize_q8_1, k.q8_0);
  set(DType::Q2_K, DType::Q8_K, dequantize_q2_k, k.quantize_q8_k, k.q2_k);
  set(DType::Q3_K, DType::Q8_K, dequantize_q3_k, k.quantize_q8_k, k.q3_k);
  set(DType::Q4_K, DType::Q8_K, k.deq.q4_k, k.quantize_q8_k, k.q4_k);
  set(DType::Q5_K, DType::Q8_K, k.deq.q5_k, k.quantize_q8_k, k.q5_k);
  set(DType::Q6_K, DType::Q8_K, k.deq.q6_k, k.quantize_q8_k, k.q6_k);
  set(DType::F8E4M3_B64, DType::F32, k.deq.f8_b64, nullptr, k.f8_b64);
  return t;
}

KernelTable make_portable() {
  using namespace scalar;
  return make_table({quantize_q8_1, quantize_q8_k, dot_f32, dot_f16, dot_bf16, dot_q4_0, dot_q4_1,
                     dot_q5_0, dot_q5_1, dot_q8_0, dot_q2_k, dot_q3_k, dot_q4_k, dot_q5_k,
                     dot_q6_k, dot_f8_b64});
}

#if defined(DEEPINFER_QUANTS_AVX2)
Dequantizers avx2_dequantizers() {
  return {avx2::dequantize_q4_0, avx2::dequantize_q4_1, avx2::dequantize_q5_0, avx2::dequantize_q5_1,
          avx2::dequantize_q8_0, avx2::dequantize_q4_k, avx2::dequantize_q5_k, avx2::dequantize_q6_k,
          avx2::dequantize_f8_b64};
}

IsaKernels avx2_kernels() {
  using namespace avx2;
  return {quantize_q8_1, quantize_q8_k, dot_f32, dot_f16, dot_bf16, dot_q4_0, dot_q4_1,
          dot_q5_0, dot_q5_1, dot_q8_0, dot_q2_k, dot_q3_k, dot_q4_k, dot_q5_k, dot_q6_k, dot_f8_b64,
          avx2_dequantizers()};
}
#endif

#if defined(DEEPINFER_QUANTS_AVX512)
// AVX-512 + VNNI (quants_dot_avx512*.cpp).
IsaKernels avx512_kernels() {
  using namespace avx512;
  return {quantize_q8_1, quantize_q8_k, dot_f32, dot_f16, dot_bf16, dot_q4_0, dot_q4_1,
          dot_q5_0, dot_q5_1, dot_q8_0, dot_q2_k, dot_q3_k, dot_q4_k, dot_q5_k, dot_q6_k, dot_f8_b64,
          avx2_dequantizers()};  // dequantisation is bound by stores: AVX2 is as fast
}
#endif

KernelTable make_for(CpuIsa isa) {
  // AMX serves the GEMM (gemm_amx.cpp); its dot products are AVX-512's.
#if defined(DEEPINFER_QUANTS_AVX512)
  if (isa >= CpuIsa::Avx512) return make_table(avx512_kernels());
#endif
#if defined(DEEPINFER_QUANTS_AVX2)
  if (isa >= CpuIsa::Avx2) return make_table(avx2_kernels());
#endif
  return make_portable();
}

const QuantKernels& lookup(const KernelTable& table, DType weight) {
  const auto i = static_cast<size_t>(weight);
  DI_CHECK(i < kNumDTypes && table[i].dot != nullptr,
           "no CPU quantisation kernels for weight dtype {}",
           i < kNumDTypes ? std::string(dtype_name(weight)) : "#" + std::to_string(i));
  return table[i];
}

}  // namespace

const QuantKernels& quant_kernels(DType weight) { return quant_kernels_for(weight, active_isa()); }

const QuantKernels& quant_kernels_for(DType weight, CpuIsa isa) {
  DI_CHECK(isa_available(isa), "CPU kernels for {} requested, but this CPU (or build) supports at most {}",
           isa_name(isa), isa_name(hardware_isa()));
  static const std::array<KernelTable, 4> tables = {make_for(CpuIsa::Scalar), make_for(CpuIsa::Avx2),
                                                    make_for(CpuIsa::Avx512), make_for(CpuIsa::Amx)};
  return lookup(tables[static_cast<size_t>(isa)], weight);
}

const QuantKernels& quant_kernels_portable(DType weight) { return quant_kernels_for(weight, CpuIsa::Scalar); }

}  // namespace deepinfer::cpu
