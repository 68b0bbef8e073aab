// AcceptanceCalibrator: maps a proposer's raw confidence for a draft token
// (its own estimate that the token is accepted, given that the drafts before
// it were) to the acceptance rate actually observed for such tokens. Raw
// confidences fall into bins; each bin counts verified and accepted tokens and
// starts from a weak prior at the raw value, so an unmeasured bin trusts the
// proposer and a measured one trusts the measurement.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer::spec {

class AcceptanceCalibrator {
 public:
  static constexpr int kBins = 20;
  // Weight of the raw confidence, in observations.
  static constexpr double kPriorWeight = 4.0;

  // The calibrated probability for a raw confidence in [0, 1].
  double calibrated(double raw) const;
  // The same plus an exploration bonus of kExploreBonus / sqrt(1 + the bin's
  // observations): what the verify-length choice uses. Drafts the policy
  // cuts are never observed, so a bin whose prior is too low (a proposer
  // that underrates deep drafts of a copied span) would stay cut; optimism
  // under uncertainty verifies it until its rate is measured.
  double optimistic(double raw) const;
  static constexpr double kExploreBonus = 0.5;
  // One verified draft token: its raw confidence and whether it was accepted.
  // Only tokens whose earlier drafts were all accepted are observations.
  void observe(double raw, bool accepted);

  int64_t observations() const;

 private:
  static int bin_of(double raw);
  std::array<int64_t, kBins> verified_{};
  std::array<int64_t, kBins> accepted_{};
};

}  // namespace deepinfer::spec
