// CpuBackend::apply_token_bitmask. Every row index is checked before any
// logit changes, so a bad call leaves the logits as they were. The work is
// split by vocabulary chunks, each thread walking every mask row over its own
// columns: a logits row named by two mask rows is then never written by two
// threads at once.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/rows.h"
#include "core/error.h"

namespace deepinfer::cpu {

namespace {

// Tokens per task: 128 mask words, 16 KiB of one logits row. Large enough that
// a 256k vocabulary makes only 64 tasks, small enough to spread over threads.
constexpr int64_t kChunkTokens = 4096;

}  // namespace

void CpuBackend::apply_token_bitmask(Tensor logits, const Tensor& bitmask, const Tensor& rows) {
  const Rows l(logits);
  const int64_t vocab = l.cols(), n_rows = l.rows();
  const int64_t m = bitmask.size(0), words = bitmask.size(1);
  const auto* masks = bitmask.data_as<const uint32_t>();
  const int32_t* row_of = rows.data_as<const int32_t>();
  for (int64_t i = 0; i < m; ++i) {
    DI_CHECK(row_of[i] >= 0 && row_of[i] < n_rows, "apply_token_bitmask: mask row {} names logits row {} outside [0, {})",
             i, row_of[i], n_rows);
  }
  // Tokens the mask has bits for; the rest of the vocabulary is not allowed.
  const int64_t covered = std::min(vocab, words * 32);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t n_chunks = (vocab + kChunkTokens - 1) / kChunkTokens;
  pool_.parallel_for(n_chunks, [&](int64_t cb, int64_t ce, int) {
    const int64_t begin = cb * kChunkTokens, end = std::min(vocab, ce * kChunkTokens);
    const int64_t mask_end = std::min(end, covered);
    for (int64_t i = 0; i < m; ++i) {
      float* x = l.row(row_of[i]);
      const uint32_t* mask = masks + i * words;
      // begin is a multiple of 32, so the chunk starts on a word boundary.
      for (int64_t t0 = begin; t0 < mask_end; t0 += 32) {
        // Bits of the disallowed tokens, cut at the vocabulary's end.
        uint32_t clear = ~mask[t0 >> 5];
        if (mask_end - t0 < 32) clear &= (uint32_t{1} << (mask_end - t0)) - 1;
        for (; clear != 0; clear &= clear - 1) x[t0 + std::countr_zero(clear)] = kNegInf;
      }
      for (int64_t t = std::max(begin, covered); t < end; ++t) x[t] = kNegInf;
    }
  });
}

}  // namespace deepinfer::cpu
