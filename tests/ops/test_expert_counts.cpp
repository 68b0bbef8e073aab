// count_experts (the EPLB load statistics' per-step counts) against a count
// by hand: padding rows (negative KV slot) skipped, accumulation across calls,
// strided id views, bad ids; on CUDA also a graph replay and the counts of
// bf16 routing compared with the CPU's on the same ids.
#include <gmock/gmock.h>

#include <functional>

#include "op_test_util.h"
#include "../support/error_message.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

using ::testing::HasSubstr;

class ExpertCountsTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(ExpertCountsTest);

std::vector<int32_t> download_i32(Backend& b, const Tensor& t) {
  std::vector<int32_t> host(static_cast<size_t>(t.numel()));
  b.copy(Tensor(host.data(), DType::I32, t.shape()), t);
  return host;
}

TEST_P(ExpertCountsTest, MatchesAHandCountAndSkipsPaddingRows) {
  Backend& b = backend();
  // 4 tokens x top-2 over 5 experts; token 2 is padding (slot -1).
  const std::vector<int32_t> ids = {0, 3, 3, 4, 1, 1, 3, 0};
  const std::vector<int32_t> slots = {7, 8, -1, 12};
  DeviceTensor id_t = upload(b, DType::I32, {4, 2}, ids.data());
  DeviceTensor slot_t = upload_i32(b, slots);
  DeviceTensor counts = zeros(b, DType::I32, {5});
  ops::count_experts(b, id_t.t, slot_t.t, counts.t);
  b.synchronize();
  EXPECT_EQ(download_i32(b, counts.t), (std::vector<int32_t>{2, 0, 0, 3, 1}));
  // A second call adds; without slots every row counts.
  ops::count_experts(b, id_t.t, Tensor(), counts.t);
  b.synchronize();
  EXPECT_EQ(download_i32(b, counts.t), (std::vector<int32_t>{4, 2, 0, 6, 2}));
}

TEST_P(ExpertCountsTest, RandomPrefillSizedBatchWithStridedIds) {
  Backend& b = backend();
  Rng rng(5);
  const int64_t n = 3000, top_k = 6, stride = 8, experts = 96;
  std::vector<int32_t> ids(static_cast<size_t>(n * stride), -7);  // columns >= top_k are not ids
  std::vector<int32_t> slots(static_cast<size_t>(n));
  std::vector<int32_t> expect(experts, 0);
  for (int64_t t = 0; t < n; ++t) {
    slots[t] = rng.uniform_int(0, 9) == 0 ? -1 : static_cast<int32_t>(t);
    for (int64_t j = 0; j < top_k; ++j) {
      // Skewed: low ids are hot, so many rows hit the same counter.
      const int32_t e = rng.uniform_int(0, 3) == 0 ? rng.uniform_int(0, 2) : rng.uniform_int(0, experts - 1);
      ids[t * stride + j] = e;
      if (slots[t] >= 0) ++expect[e];
    }
  }
  DeviceTensor wide = upload(b, DType::I32, {n, stride}, ids.data());
  DeviceTensor slot_t = upload_i32(b, slots);
  DeviceTensor counts = zeros(b, DType::I32, {experts});
  ops::count_experts(b, wide.t.narrow(1, 0, top_k), slot_t.t, counts.t);
  b.synchronize();
  EXPECT_EQ(download_i32(b, counts.t), expect);
}

TEST_P(ExpertCountsTest, RejectsBadShapesAndBadIds) {
  Backend& b = backend();
  DeviceTensor ids = zeros(b, DType::I32, {3, 2});
  DeviceTensor counts = zeros(b, DType::I32, {4});
  DeviceTensor slots4 = zeros(b, DType::I32, {4});
  DeviceTensor f32_counts = zeros(b, DType::F32, {4});
  EXPECT_THAT(error_of([&] { ops::count_experts(b, ids.t, slots4.t, counts.t); }), HasSubstr("must have 3 entries"));
  EXPECT_THAT(error_of([&] { ops::count_experts(b, ids.t, Tensor(), f32_counts.t); }), HasSubstr("must be i32"));
  EXPECT_THAT(error_of([&] { ops::count_experts(b, ids.t.row(0), Tensor(), counts.t); }), HasSubstr("rank 2"));

  const std::vector<int32_t> bad = {0, 1, 2, 4, 3, 0};
  DeviceTensor bad_ids = upload(b, DType::I32, {3, 2}, bad.data());
  const bool cpu = b.device().type == DeviceType::CPU;
  EXPECT_THAT(error_of([&] {
                ops::count_experts(b, bad_ids.t, Tensor(), counts.t);
                b.synchronize();
              }),
              HasSubstr(cpu ? "expert id 4 of token 1 out of range [0, 4)" : "count_experts: expert id out of range"));
  if (!cpu) {
    EXPECT_NO_THROW(b.synchronize());  // reported once; the backend stays usable
  }
  // The bad id is not counted (on the CPU nothing of that call is).
  const std::vector<int32_t> after = download_i32(b, counts.t);
  EXPECT_EQ(after[0] + after[1] + after[2] + after[3], cpu ? 0 : 5);
  // A padding row's ids are never looked at.
  const std::vector<int32_t> slots = {0, -1, 2};
  DeviceTensor slot_t = upload_i32(b, slots);
  DeviceTensor fresh = zeros(b, DType::I32, {4});
  ops::count_experts(b, bad_ids.t, slot_t.t, fresh.t);
  EXPECT_NO_THROW(b.synchronize());
  EXPECT_EQ(download_i32(b, fresh.t), (std::vector<int32_t>{2, 1, 0, 1}));
}

// The runner captures decode steps as graphs: a captured count must add the
// ids present at each replay, and keep skipping padding rows.
TEST_P(ExpertCountsTest, GraphReplayCountsTheCurrentIds) {
  Backend& b = backend();
  if (!b.supports_graphs()) GTEST_SKIP() << "no graph capture on this backend";
  DeviceTensor ids = zeros(b, DType::I32, {4, 2});
  const std::vector<int32_t> slots = {1, 2, 3, -1};
  DeviceTensor slot_t = upload_i32(b, slots);
  DeviceTensor counts = zeros(b, DType::I32, {6});
  ops::count_experts(b, ids.t, slot_t.t, counts.t);  // eager first, outside the capture
  b.begin_capture();
  ops::count_experts(b, ids.t, slot_t.t, counts.t);
  std::unique_ptr<OpGraph> graph = b.end_capture();
  const std::vector<int32_t> step1 = {5, 1, 5, 2, 0, 5, 4, 4};
  b.copy(ids.t, Tensor(const_cast<int32_t*>(step1.data()), DType::I32, {4, 2}));
  graph->replay();
  const std::vector<int32_t> step2 = {3, 3, 3, 3, 3, 3, 1, 1};
  b.copy(ids.t, Tensor(const_cast<int32_t*>(step2.data()), DType::I32, {4, 2}));
  graph->replay();
  b.synchronize();
  // Eager call on zeros: 6 at expert 0; step 1: 0,5,1,5,2,5 (row 3 is padding); step 2: six 3s.
  EXPECT_EQ(download_i32(b, counts.t), (std::vector<int32_t>{7, 1, 1, 6, 0, 3}));
}

// Routing on the GPU in its production dtype, counted on the GPU, equals the
// CPU count of the same ids.
class ExpertCountsCudaVsCpu : public CudaVsCpuTest {};

TEST_F(ExpertCountsCudaVsCpu, CountsOfBf16RoutingMatchTheCpuCountOfTheSameIds) {
  Rng rng(9);
  const int64_t n = 512, experts = 64;
  MoeRouteParams p;
  p.top_k = 8;
  DeviceTensor logits = upload_bf16(gpu(), {n, experts}, rng.floats(n * experts, -3.0f, 3.0f));
  DeviceTensor ids = zeros(gpu(), DType::I32, {n, p.top_k});
  DeviceTensor weights = zeros(gpu(), DType::F32, {n, p.top_k});
  ops::moe_route(gpu(), logits.t, p, ids.t, weights.t);
  std::vector<int32_t> slots(n);
  for (int64_t t = 0; t < n; ++t) slots[t] = t % 7 == 3 ? -1 : static_cast<int32_t>(t);
  DeviceTensor gpu_slots = upload_i32(gpu(), slots);
  DeviceTensor gpu_counts = zeros(gpu(), DType::I32, {experts});
  ops::count_experts(gpu(), ids.t, gpu_slots.t, gpu_counts.t);
  gpu().synchronize();

  const std::vector<int32_t> host_ids = download_i32(gpu(), ids.t);
  DeviceTensor cpu_ids = upload(cpu(), DType::I32, {n, p.top_k}, host_ids.data());
  DeviceTensor cpu_slots = upload_i32(cpu(), slots);
  DeviceTensor cpu_counts = zeros(cpu(), DType::I32, {experts});
  ops::count_experts(cpu(), cpu_ids.t, cpu_slots.t, cpu_counts.t);
  const std::vector<int32_t> want = download_i32(cpu(), cpu_counts.t);
  EXPECT_EQ(download_i32(gpu(), gpu_counts.t), want);
  int64_t total = 0;
  for (int32_t c : want) total += c;
  EXPECT_EQ(total, (n - n / 7 - (n % 7 > 3 ? 1 : 0)) * p.top_k);
}

}  // namespace
}  // namespace deepinfer::testing
