// The ops:: entry points reject malformed arguments with messages that name the
// op and the offending tensors, before any backend code runs.
#include <gmock/gmock.h>

#include "op_test_util.h"
#include "../support/error_message.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

using ::testing::HasSubstr;

class ValidationTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(ValidationTest);

TEST_P(ValidationTest, LinearShapesAndDtypes) {
  Backend& b = backend();
  DeviceTensor x = zeros(b, DType::F32, {3, 64});
  DeviceTensor w = zeros(b, DType::Q4_0, {128, 96});
  DeviceTensor out = zeros(b, DType::F32, {3, 128});
  std::string device = b.device().type == DeviceType::CPU ? "cpu" : "cuda:0";
  EXPECT_EQ(error_of([&] { ops::linear(b, x.t, w.t, Tensor(), out.t); }),
            "linear: x f32[3, 64] " + device + " does not match weight q4_0[128, 96] " + device +
                " in the inner dimension");
  DeviceTensor w2 = zeros(b, DType::F32, {128, 64});
  DeviceTensor small_out = zeros(b, DType::F32, {3, 127});
  EXPECT_THAT(error_of([&] { ops::linear(b, x.t, w2.t, Tensor(), small_out.t); }), HasSubstr("must be [3, 128]"));
  DeviceTensor bias = zeros(b, DType::F32, {64});
  EXPECT_THAT(error_of([&] { ops::linear(b, x.t, w2.t, bias.t, out.t); }), HasSubstr("bias"));
  DeviceTensor x16 = zeros(b, DType::I32, {3, 64});
  EXPECT_THAT(error_of([&] { ops::linear(b, x16.t, w2.t, Tensor(), out.t); }), HasSubstr("linear: x i32[3, 64]"));
  DeviceTensor x3 = zeros(b, DType::F32, {1, 3, 64});
  EXPECT_THAT(error_of([&] { ops::linear(b, x3.t, w2.t, Tensor(), out.t); }), HasSubstr("must have rank 2"));
}

TEST_P(ValidationTest, HostTensorsOnOtherDevicesAreRejected) {
  if (backend().device().type == DeviceType::CPU) GTEST_SKIP() << "host and device are the same here";
  std::vector<float> host(8, 0.0f);
  Tensor h(host.data(), DType::F32, {2, 4});
  DeviceTensor out = zeros(backend(), DType::F32, {2, 4});
  EXPECT_THAT(error_of([&] { ops::add(backend(), h, h, out.t); }), HasSubstr("is not on the"));
}

TEST_P(ValidationTest, NormRopeAttentionAndElementwise) {
  Backend& b = backend();
  DeviceTensor x = zeros(b, DType::F32, {2, 8});
  DeviceTensor w = zeros(b, DType::F32, {9});
  EXPECT_THAT(error_of([&] { ops::rms_norm(b, x.t, w.t, 1e-6f, 0.0f, x.t); }),
              HasSubstr("rms_norm: weight f32[9]"));
  DeviceTensor other = zeros(b, DType::F32, {2, 9});
  EXPECT_THAT(error_of([&] { ops::add(b, x.t, other.t, x.t); }), HasSubstr("must have the same shape"));
  EXPECT_THAT(error_of([&] { ops::gated_activation(b, x.t, other.t, Activation::Silu, x.t); }),
              HasSubstr("gated_activation"));

  DeviceTensor q = zeros(b, DType::F32, {2, 4, 64});
  DeviceTensor pos = upload_i32(b, {0, 1});
  DeviceTensor freq = zeros(b, DType::F32, {16});
  RopeParams odd{freq.t, 33, RopeStyle::Neox, 1.0f};
  EXPECT_THAT(error_of([&] { ops::rope(b, q.t, Tensor(), pos.t, odd); }), HasSubstr("rotary_dim 33"));
  RopeParams wrong_freq{freq.t, 64, RopeStyle::Neox, 1.0f};
  EXPECT_THAT(error_of([&] { ops::rope(b, q.t, Tensor(), pos.t, wrong_freq); }), HasSubstr("inv_freq"));
  DeviceTensor short_pos = upload_i32(b, {0});
  RopeParams ok{freq.t, 32, RopeStyle::Neox, 1.0f};
  EXPECT_THAT(error_of([&] { ops::rope(b, q.t, Tensor(), short_pos.t, ok); }), HasSubstr("positions"));

  DeviceTensor cache = zeros(b, DType::F32, {2, 16, 3, 64});
  DeviceTensor out = zeros(b, DType::F32, {2, 4, 64});
  AttentionMetadata meta;
  EXPECT_THAT(error_of([&] { ops::attention(b, q.t, KvCacheLayer{cache.t, cache.t}, meta, {}, out.t); }),
              HasSubstr("multiple of the cache's KV heads"));
  DeviceTensor kv = zeros(b, DType::F32, {2, 2, 64});
  DeviceTensor slots = upload_i32(b, {0, 1});
  EXPECT_THAT(error_of([&] { ops::store_kv(b, kv.t, kv.t, slots.t, KvCacheLayer{cache.t, cache.t}); }),
              HasSubstr("store_kv: k f32[2, 2, 64]"));
}

}  // namespace
}  // namespace deepinfer::testing
