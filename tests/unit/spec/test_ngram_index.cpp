// N-gram (prompt lookup) drafting: the incremental index proposes exactly what
// a scan of the whole sequence would, at every length, on sequences with many
// repeats; plus the cases a reader checks by hand.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"
#include "spec/ngram_index.h"

namespace deepinfer::spec {
namespace {

// The definition, by brute force: for n from max_n down to min_n, the latest
// q < L - 1 whose n tokens ending at q equal the last n; the draft is what
// follows q, up to max_tokens and the end of the sequence.
std::vector<int32_t> scan_proposal(const std::vector<int32_t>& s, NgramConfig c, int32_t max_tokens) {
  const int32_t len = static_cast<int32_t>(s.size());
  for (int32_t n = c.max_n; n >= c.min_n; --n) {
    if (n > len - 1) continue;
    for (int32_t q = len - 2; q >= n - 1; --q) {
      bool same = true;
      for (int32_t i = 0; i < n && same; ++i) same = s[static_cast<size_t>(q - i)] == s[static_cast<size_t>(len - 1 - i)];
      if (!same) continue;
      std::vector<int32_t> out;
      for (int32_t i = 1; i <= max_tokens && q + i < len; ++i) out.push_back(s[static_cast<size_t>(q + i)]);
      return out;
    }
  }
  return {};
}

TEST(NgramIndex, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  NgramIndex index({.min_n = 2, .max_n = 3});
  index.append(std::vector<int32_t>{10, 11, 12, 13, 14, 10, 11});
  Draft d;
  index.propose(5, d);
  // "10 11" ended at position 1 before; what followed runs up to the sequence's end.
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{12, 13, 14, 10, 11}));
  EXPECT_EQ(index.matched_length(), 2);
  ASSERT_EQ(d.confidence.size(), d.tokens.size());
  for (size_t i = 1; i < d.confidence.size(); ++i) EXPECT_LT(d.confidence[i], d.confidence[i - 1]);
  index.propose(2, d);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{12, 13}));

  // The longest suffix wins over a more recent shorter one.
  NgramIndex longest({.min_n = 1, .max_n = 3});
  longest.append(std::vector<int32_t>{1, 2, 3, 7, 9, 3, 8, 1, 2, 3});
  longest.propose(1, d);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{7}));  // "1 2 3" -> 7, not "3" -> 8
  EXPECT_EQ(longest.matched_length(), 3);
}

TEST(NgramIndex, NoProposalWithoutAnEarlierOccurrence) {
  NgramIndex index({.min_n = 2, .max_n = 4});
  Draft d;
  index.propose(5, d);
  EXPECT_EQ(d.size(), 0);
  index.append(std::vector<int32_t>{1, 2, 3, 4, 5});
  index.propose(5, d);
  EXPECT_EQ(d.size(), 0);
  EXPECT_EQ(index.matched_length(), 0);
  index.propose(0, d);
  EXPECT_EQ(d.size(), 0);
  // A single repeated token is no 2-gram match until it has occurred twice before.
  NgramIndex repeat({.min_n = 2, .max_n = 2});
  repeat.append(std::vector<int32_t>{7, 7});
  repeat.propose(3, d);
  EXPECT_EQ(d.size(), 0);
  repeat.append(7);
  repeat.propose(3, d);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{7}));
}

TEST(NgramIndex, MatchesAScanOfTheWholeSequenceAtEveryLength) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const NgramConfig c{.min_n = 1 + trial % 3, .max_n = 1 + trial % 3 + trial % 4};
    const int vocab = 2 + trial % 6;  // small vocabularies repeat often
    std::uniform_int_distribution<int32_t> token(0, vocab - 1);
    NgramIndex index(c);
    std::vector<int32_t> seq;
    Draft d;
    for (int step = 0; step < 300; ++step) {
      // Sometimes several tokens at once (a prompt, or accepted drafts).
      const int count = step % 7 == 0 ? 5 : 1;
      std::vector<int32_t> add;
      for (int i = 0; i < count; ++i) add.push_back(token(rng));
      seq.insert(seq.end(), add.begin(), add.end());
      index.append(add);
      const int32_t k = 1 + step % 6;
      index.propose(k, d);
      ASSERT_EQ(d.tokens, scan_proposal(seq, c, k)) << "trial " << trial << " length " << seq.size();
    }
  }
}

TEST(NgramIndex, RejectsBadConfigurations) {
  EXPECT_THROW(NgramIndex({.min_n = 0, .max_n = 2}), Error);
  EXPECT_THROW(NgramIndex({.min_n = 3, .max_n = 2}), Error);
  EXPECT_THROW(NgramIndex({.min_n = 1, .max_n = 65}), Error);
}

}  // namespace
}  // namespace deepinfer::spec
