#include "core/dtype.h"

#include "core/error.h"

namespace deepinfer {

namespace {
constexpr int kQK_K = 256;  // super-block size of the K-quant formats
constexpr DTypeInfo kInfos[] = {
    {"f32", 1, 4, false},
    {"f16", 1, 2, false},
    {"bf16", 1, 2, false},
    {"i32", 1, 4, false},
    {"i64", 1, 8, false},
    {"i8", 1, 1, false},
    {"u8", 1, 1, false},
    {"q4_0", 32, 2 + 16, true},
    {"q4_1", 32, 2 + 2 + 16, true},
    {"q5_0", 32, 2 + 4 + 16, true},
    {"q5_1", 32, 2 + 2 + 4 + 16, true},
    {"q8_0", 32, 2 + 32, true},
    {"q8_1", 32, 4 + 4 + 32, true},
    {"q2_K", kQK_K, kQK_K / 16 + kQK_K / 4 + 2 + 2, true},
    {"q3_K", kQK_K, kQK_K / 8 + kQK_K / 4 + 12 + 2, true},
    {"q4_K", kQK_K, 2 + 2 + 12 + kQK_K / 2, true},
    {"q5_K", kQK_K, 2 + 2 + 12 + kQK_K / 8 + kQK_K / 2, true},
    {"q6_K", kQK_K, kQK_K / 2 + kQK_K / 4 + kQK_K / 16 + 2, true},
    {"q8_K", kQK_K, 4 + kQK_K + kQK_K / 16 * 2, true},
    {"f8_e4m3", 1, 1, false},
    {"f8_e4m3_b64", 64, 4 + 64, true},
};
static_assert(sizeof(kInfos) / sizeof(kInfos[0]) == static_cast<size_t>(DType::Count));
}  // namespace

const DTypeInfo& dtype_info(DType t) {
  auto i = static_cast<size_t>(t);
  DI_CHECK(i < static_cast<size_t>(DType::Count), "invalid dtype id {}", i);
  return kInfos[i];
}

size_t row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  DI_CHECK(n >= 0 && n % info.block_elems == 0,
           "row of {} elements is not a multiple of the {} block size {}", n, info.name,
           info.block_elems);
  return static_cast<size_t>(n / info.block_elems) * static_cast<size_t>(info.block_bytes);
}

}  // namespace deepinfer
