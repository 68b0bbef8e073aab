// The dynamic verify length's parts: the acceptance calibrator, the online
// step-time curve, and the choice of drafts that maximises expected tokens
// per unit of step time.
#include <gtest/gtest.h>

#include "core/error.h"
#include "spec/acceptance_calibrator.h"
#include "spec/step_time_curve.h"
#include "spec/verify_length.h"

namespace deepinfer::spec {
namespace {

TEST(AcceptanceCalibrator, TrustsTheProposerUntilMeasuredThenTheMeasurement) {
  AcceptanceCalibrator c;
  EXPECT_NEAR(c.calibrated(0.7), 0.7, 1e-9);
  // Drafts claimed at 0.8 are accepted only 1 time in 5.
  for (int i = 0; i < 1000; ++i) c.observe(0.8, i % 5 == 0);
  EXPECT_NEAR(c.calibrated(0.8), 0.2, 0.01);
  EXPECT_NEAR(c.calibrated(0.3), 0.3, 1e-9) << "other bins keep their prior";
  EXPECT_EQ(c.observations(), 1000);
  for (int i = 0; i < 1000; ++i) c.observe(0.1, false);
  EXPECT_GT(c.calibrated(0.1), 0.0) << "never certain of rejection";
}

TEST(AcceptanceCalibrator, OptimismShrinksWithObservations) {
  AcceptanceCalibrator c;
  // Unmeasured: the prior plus the full bonus.
  EXPECT_NEAR(c.optimistic(0.3), 0.3 + AcceptanceCalibrator::kExploreBonus, 1e-9);
  // A bin the proposer underrates (claimed 0.3, accepted 9 in 10): optimism
  // gets it verified, and the measurement then carries it.
  for (int i = 0; i < 99; ++i) c.observe(0.3, i % 10 != 0);
  EXPECT_NEAR(c.calibrated(0.3), (89.0 + 4 * 0.3) / (99.0 + 4), 1e-9);
  EXPECT_NEAR(c.optimistic(0.3), c.calibrated(0.3) + 0.05, 1e-9);
  // Rejected drafts: the bonus fades, the rate is measured.
  for (int i = 0; i < 9999; ++i) c.observe(0.6, false);
  EXPECT_LT(c.optimistic(0.6), 0.011);
  EXPECT_LE(c.optimistic(0.95), 0.995);
}

TEST(StepTimeCurve, InterpolatesMeasuredBinsAndExtendsTheLastSlope) {
  StepTimeCurve curve;
  EXPECT_EQ(curve.predict(8), 0.0);
  curve.record(1, 10.0);
  EXPECT_EQ(curve.predict(1), 10.0);
  EXPECT_EQ(curve.predict(64), 10.0) << "one measured bin: flat";
  curve.record(8, 17.0);
  EXPECT_NEAR(curve.predict(4), 13.0, 1e-9);
  EXPECT_NEAR(curve.predict(16), 25.0, 1e-9) << "beyond: the slope of the last two";
  for (int i = 0; i < 200; ++i) curve.record(8, 27.0);
  EXPECT_NEAR(curve.predict(8), 27.0, 0.01) << "the bin follows recent steps";
  EXPECT_EQ(curve.num_measured_bins(), 2);
  const auto points = curve.measured();
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].first, 1);
  EXPECT_EQ(points[0].second, 10.0);
  EXPECT_EQ(points[1].first, 8);
  EXPECT_NEAR(points[1].second, 27.0, 0.01);
  EXPECT_EQ(StepTimeCurve::bin_of(0), 0);
  EXPECT_GT(StepTimeCurve::bin_of(100000), StepTimeCurve::bin_of(1000));
}

int total(const VerifyChoice& c) {
  int n = 0;
  for (int32_t l : c.lengths) n += l;
  return n;
}

TEST(VerifyLength, VerifiesEverythingWhenTokensAreFreeOrTheCurveIsUnknown) {
  const std::vector<std::vector<double>> accept = {{0.9, 0.8, 0.5, 0.3, 0.2}, {0.4, 0.4}};
  StepTimeCurve unknown;
  EXPECT_EQ(choose_verify_lengths(accept, 2, 2, unknown).lengths, (std::vector<int32_t>{5, 2}));
  StepTimeCurve flat;  // memory-bound: a step of 64 tokens costs what one of 1 does
  flat.record(1, 5.0);
  flat.record(64, 5.0);
  EXPECT_EQ(choose_verify_lengths(accept, 2, 2, flat).lengths, (std::vector<int32_t>{5, 2}));
}

TEST(VerifyLength, ShrinksAsStepsBecomeComputeBound) {
  // A fixed cost per step plus a cost per token: a draft pays only while its
  // chance to be reached beats the step's current tokens per unit of time.
  StepTimeCurve linear;
  for (int t : {1, 8, 64, 256, 512}) linear.record(t, 1.0 + 0.5 * t);
  const std::vector<std::vector<double>> accept = {{0.95, 0.9, 0.5, 0.3, 0.2}};
  const VerifyChoice alone = choose_verify_lengths(accept, 1, 1, linear);
  // One request: (1 + reach sum) / (1.5 + 0.5 n) is 0.67, 0.98, 1.12, 1.08
  // for n = 0..3 (reach 0.95, 0.855, 0.43): two drafts.
  EXPECT_EQ(alone.lengths[0], 2);
  std::vector<std::vector<double>> many(200, {0.6, 0.5, 0.4});
  const VerifyChoice big = choose_verify_lengths(many, 200, 200, linear);
  EXPECT_EQ(total(big), 0) << "compute-bound: a draft reached with p < 1 costs more than it yields";
  // Among requests, better drafts go first and each request keeps a prefix.
  StepTimeCurve knee;  // free up to 16 tokens, then linear
  knee.record(1, 4.0);
  knee.record(16, 4.0);
  knee.record(64, 16.0);
  const std::vector<std::vector<double>> mixed = {{0.99, 0.99, 0.99, 0.99}, {0.2, 0.9, 0.9}, {0.9, 0.1}};
  const VerifyChoice c = choose_verify_lengths(mixed, 8, 8, knee);
  EXPECT_EQ(c.lengths, (std::vector<int32_t>{4, 3, 2})) << "all 9 fit under the knee";
  const VerifyChoice tight = choose_verify_lengths(mixed, 15, 15, knee);
  EXPECT_LE(total(tight), total(c));
  EXPECT_GE(tight.lengths[0], tight.lengths[1]) << "the surer request is not cut first";
}

TEST(VerifyLength, DraftingOverheadMustBeEarned) {
  // Steps cost 5 ms whatever their size, but a step that verifies drafts
  // also costs the host work the pipelined loop would have hidden.
  StepTimeCurve flat;
  flat.record(1, 5.0);
  flat.record(256, 5.0);
  const std::vector<std::vector<double>> weak(64, {0.3, 0.2});
  // 64 outputs in 5 ms vs 64 + 64 * (0.3 + 0.06) = 87 in 10 ms: not worth it.
  EXPECT_EQ(total(choose_verify_lengths(weak, 64, 64, flat, 5.0)), 0);
  EXPECT_EQ(total(choose_verify_lengths(weak, 64, 64, flat, 0.0)), 128) << "free when there is no overhead";
  const std::vector<std::vector<double>> strong(64, {0.95, 0.95, 0.95});
  // 64 + 64 * 2.71 = 237 in 10 ms beats 64 in 5 ms.
  EXPECT_EQ(total(choose_verify_lengths(strong, 64, 64, flat, 5.0)), 192);
}

}  // namespace
}  // namespace deepinfer::spec
