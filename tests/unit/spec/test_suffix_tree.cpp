// Suffix decoding: the incremental tree counts exactly what a scan of the held
// sequences counts (also after removals), drafts exactly what a brute-force
// reading of its definition drafts, and the proposer combines the per-request
// and global trees as documented; plus the cases a reader checks by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "spec/proposer.h"
#include "spec/suffix_proposer.h"
#include "spec/suffix_tree.h"

namespace deepinfer::spec {
namespace {

using Tokens = std::vector<int32_t>;

// Occurrences of x as a contiguous run in the sequences, by scanning.
int32_t scan_count(const std::vector<Tokens>& seqs, const Tokens& x) {
  int32_t n = 0;
  for (const Tokens& s : seqs) {
    for (size_t p = 0; p + x.size() <= s.size(); ++p) n += std::equal(x.begin(), x.end(), s.begin() + p);
  }
  return n;
}

// What follows the occurrences of x, token -> times (ascending token order).
std::map<int32_t, int32_t> scan_continuations(const std::vector<Tokens>& seqs, const Tokens& x) {
  std::map<int32_t, int32_t> next;
  for (const Tokens& s : seqs) {
    for (size_t p = 0; p + x.size() < s.size(); ++p) {
      if (std::equal(x.begin(), x.end(), s.begin() + p)) ++next[s[p + x.size()]];
    }
  }
  return next;
}

// Checks every substring of length <= depth against the scan, and that the
// tree has no other nodes.
void expect_counts_match(const SuffixTree& tree, const std::vector<Tokens>& seqs) {
  std::set<Tokens> distinct;
  for (const Tokens& s : seqs) {
    for (size_t p = 0; p < s.size(); ++p) {
      for (size_t len = 1; len <= static_cast<size_t>(tree.max_depth()) && p + len <= s.size(); ++len) {
        distinct.emplace(s.begin() + p, s.begin() + p + len);
      }
    }
  }
  for (const Tokens& x : distinct) ASSERT_EQ(tree.count(x), scan_count(seqs, x));
  EXPECT_EQ(tree.num_nodes(), distinct.size());
  int64_t tokens = 0;
  for (const Tokens& s : seqs) tokens += static_cast<int64_t>(s.size());
  EXPECT_EQ(tree.num_tokens(), tokens);
}

// The drafting rule, read literally: the longest qualifying context suffix
// that was followed by something, then the most frequent continuation (ties:
// smaller token) while the running product stays >= min_prob.
int32_t scan_propose(const std::vector<Tokens>& seqs, int32_t depth, const Tokens& context,
                     const SuffixProposeConfig& c, Draft& out) {
  out.clear();
  const int32_t n = static_cast<int32_t>(context.size());
  for (int32_t len = std::min({c.max_match, depth - 1, n}); len >= c.min_match; --len) {
    Tokens x(context.end() - len, context.end());
    if (scan_continuations(seqs, x).empty()) continue;
    float path = 1.0f;
    while (out.size() < c.max_tokens && static_cast<int32_t>(x.size()) < depth) {
      const auto next = scan_continuations(seqs, x);
      int32_t total = 0, best = -1, best_count = 0;
      for (auto [token, count] : next) {
        total += count;
        if (count > best_count) {  // strictly: the first (smallest) token of a tie stays
          best = token;
          best_count = count;
        }
      }
      if (best < 0) break;
      const float p = static_cast<float>(best_count) / static_cast<float>(total);
      path *= p;
      if (path < c.min_prob) break;
      out.tokens.push_back(best);
      out.confidence.push_back(std::clamp(p, 0.01f, 0.99f));
      x.push_back(best);
    }
    return len;
  }
  return 0;
}

TEST(SuffixTree, CountsEverySubstringLikeAScanAndForgetsRemovedSequences) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    const int32_t depth = 2 + trial % 6;
    std::uniform_int_distribution<int32_t> token(0, 1 + trial % 3);  // small alphabets repeat often
    SuffixTree tree(depth);
    std::map<int32_t, Tokens> held;  // handle -> tokens
    for (int s = 0; s < 5; ++s) held[tree.add_sequence()];
    // Interleaved appends in chunks of random size (prompts, accepted drafts).
    for (int step = 0; step < 60; ++step) {
      auto it = std::next(held.begin(), step % 5);
      Tokens chunk(static_cast<size_t>(rng() % 6));
      for (int32_t& t : chunk) t = token(rng);
      tree.append(it->first, chunk);
      it->second.insert(it->second.end(), chunk.begin(), chunk.end());
    }
    auto values = [&] {
      std::vector<Tokens> v;
      for (auto& [h, s] : held) v.push_back(s);
      return v;
    };
    expect_counts_match(tree, values());
    for (auto& [h, s] : held) EXPECT_EQ(Tokens(tree.tokens(h).begin(), tree.tokens(h).end()), s);

    // Remove in a random order, checking after each removal.
    std::vector<int32_t> order;
    for (auto& [h, s] : held) order.push_back(h);
    std::shuffle(order.begin(), order.end(), rng);
    for (int32_t h : order) {
      tree.remove_sequence(h);
      held.erase(h);
      expect_counts_match(tree, values());
      EXPECT_THROW(tree.append(h, Tokens{1}), Error);
    }
    // Empty again: only the root is left, and the tree is usable afterwards.
    EXPECT_EQ(tree.num_nodes(), 0u);
    EXPECT_EQ(tree.num_sequences(), 0);
    const int32_t again = tree.add_sequence();
    tree.append(again, Tokens{1, 2, 1, 2});
    expect_counts_match(tree, {{1, 2, 1, 2}});
  }
}

TEST(SuffixTree, DraftsTheMostFrequentContinuation) {
  SuffixTree tree(8);
  const Tokens seq{1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2};
  tree.append(tree.add_sequence(), seq);
  Draft d;
  // "1 2" was followed by 3 twice and 4 once; "4 1 2" only now (no continuation).
  EXPECT_EQ(tree.propose(seq, {.min_match = 2, .max_tokens = 5}, d), 2);
  EXPECT_EQ(d.tokens, (Tokens{3, 1, 2, 3, 1}));
  // "1 2 3 1 2" was followed by 3 and 4 once each: the tie goes to 3.
  const std::vector<float> expected{2.0f / 3.0f, 0.99f, 0.99f, 0.5f, 0.99f};
  ASSERT_EQ(d.confidence.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_FLOAT_EQ(d.confidence[i], expected[i]) << i;

  tree.propose(seq, {.min_match = 2, .max_tokens = 2}, d);
  EXPECT_EQ(d.tokens, (Tokens{3, 1}));
  // The fourth token would bring the path's probability to 1/3.
  tree.propose(seq, {.min_match = 2, .max_tokens = 5, .min_prob = 0.5f}, d);
  EXPECT_EQ(d.tokens, (Tokens{3, 1, 2}));
  // Even the first token (2/3) is too unlikely: a match, but no draft.
  EXPECT_EQ(tree.propose(seq, {.min_match = 2, .max_tokens = 5, .min_prob = 0.7f}, d), 2);
  EXPECT_EQ(d.size(), 0);
  // The walk ends at max_depth: "1 2" plus at most 6 more tokens.
  tree.propose(seq, {.min_match = 2, .max_tokens = 20, .min_prob = 0.0f}, d);
  EXPECT_EQ(d.size(), 6);
}

TEST(SuffixTree, TheLongestContinuedSuffixWins) {
  SuffixTree tree(8);
  // "2" is followed by 8 twice and 7 once, but "5 1 2" was followed by 7.
  const Tokens seq{5, 1, 2, 7, 9, 2, 8, 3, 2, 8, 5, 1, 2};
  tree.append(tree.add_sequence(), seq);
  Draft d;
  EXPECT_EQ(tree.propose(seq, {.min_match = 1, .max_tokens = 1}, d), 3);
  EXPECT_EQ(d.tokens, (Tokens{7}));
  // Capping the match at one token falls back to the frequency after "2".
  EXPECT_EQ(tree.propose(seq, {.min_match = 1, .max_match = 1, .max_tokens = 1}, d), 1);
  EXPECT_EQ(d.tokens, (Tokens{8}));
  EXPECT_FLOAT_EQ(d.confidence[0], 2.0f / 3.0f);
}

TEST(SuffixTree, NoDraftWithoutAnEarlierContinuation) {
  SuffixTree tree(6);
  const Tokens seq{1, 2, 3, 4};
  tree.append(tree.add_sequence(), seq);
  Draft d;
  d.tokens = {42};
  EXPECT_EQ(tree.propose(seq, {}, d), 0);  // "3 4" is there, but nothing followed it yet
  EXPECT_EQ(d.size(), 0);
  EXPECT_EQ(tree.propose(Tokens{9, 9}, {}, d), 0);  // absent
  EXPECT_EQ(tree.propose(Tokens{2}, {}, d), 0);     // shorter than min_match
  EXPECT_EQ(tree.propose(Tokens{}, {}, d), 0);
  EXPECT_EQ(d.size(), 0);
  EXPECT_EQ(tree.propose(Tokens{1, 2}, {}, d), 2);
  EXPECT_EQ(d.tokens, (Tokens{3, 4}));
  EXPECT_THROW(tree.propose(seq, {.min_match = 0}, d), Error);
  EXPECT_THROW(tree.propose(seq, {.min_prob = 1.5f}, d), Error);
  EXPECT_THROW(SuffixTree(1), Error);
  EXPECT_THROW(tree.remove_sequence(5), Error);
}

TEST(SuffixTree, DraftsAreRealContinuationsAndMatchTheDefinition) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 30; ++trial) {
    const int32_t depth = 3 + trial % 7;
    std::uniform_int_distribution<int32_t> token(0, 1 + trial % 4);
    SuffixTree tree(depth);
    std::vector<Tokens> seqs(1 + trial % 3);
    std::vector<int32_t> handles;
    for (Tokens& s : seqs) {
      s.resize(20 + rng() % 40);
      for (int32_t& t : s) t = token(rng);
      handles.push_back(tree.add_sequence());
      tree.append(handles.back(), s);
    }
    const SuffixProposeConfig c{.min_match = 1 + trial % 2, .max_match = 2 + trial % 5,
                                .max_tokens = 1 + trial % 6, .min_prob = 0.05f * static_cast<float>(trial % 5)};
    for (int q = 0; q < 40; ++q) {
      // A held sequence itself (the per-request case) or an unrelated context.
      Tokens context = q % 2 == 0 ? seqs[static_cast<size_t>(q) % seqs.size()] : Tokens(1 + rng() % 8);
      if (q % 2 == 1) {
        for (int32_t& t : context) t = token(rng);
      }
      Draft got, want;
      const int32_t matched = tree.propose(context, c, got);
      ASSERT_EQ(matched, scan_propose(seqs, depth, context, c, want)) << "trial " << trial << " query " << q;
      ASSERT_EQ(got.tokens, want.tokens) << "trial " << trial << " query " << q;
      for (int32_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got.confidence[i], want.confidence[i]);
      if (q % 2 == 0) {
        // A held sequence: its own suffix list gives the same draft.
        Draft after;
        EXPECT_EQ(tree.propose_after(handles[static_cast<size_t>(q) % seqs.size()], c, after), matched);
        EXPECT_EQ(after.tokens, got.tokens);
        EXPECT_EQ(after.confidence, got.confidence);
      }
      if (matched == 0) continue;
      Tokens run(context.end() - matched, context.end());
      run.insert(run.end(), got.tokens.begin(), got.tokens.end());
      EXPECT_GT(scan_count(seqs, run), 0) << "trial " << trial << " query " << q;
    }
  }
}

// The engine's suffix proposer fills the global tree on a thread of its own:
// a finished request's output becomes a draft for a later request once the
// insertion lands, and proposals meanwhile draft from the request's own tree.
TEST(SuffixProposer, EnginesProposerFillsTheGlobalTreeInTheBackground) {
  SpeculativeConfig config;
  config.method = SpecMethod::Suffix;
  auto p = make_proposer(config);
  p->start(1, Tokens{100, 101, 102});
  p->append(1, Tokens{1, 2, 3, 4, 5, 6, 7, 8});
  p->finish(1);
  p->start(2, Tokens{50, 1, 2});
  Draft d;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    p->propose(2, 5, d);
    if (d.size() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(d.tokens, (Tokens{3, 4, 5, 6, 7}));
  // Many finished outputs at once, beyond the global budget: the queue drops
  // the oldest, and the proposer is destroyed with insertions pending.
  SpeculativeConfig small = config;
  small.suffix_global_max_tokens = 64;
  auto q = make_proposer(small);
  for (uint64_t id = 0; id < 200; ++id) {
    q->start(id, Tokens{1, 2, 3});
    q->append(id, Tokens{static_cast<int32_t>(id), 4, 5, 6, 7, 8, 9, 10});
    q->finish(id);
  }
  q->start(1000, Tokens{9});
  q->propose(1000, 5, d);
}

TEST(SuffixProposer, FinishedOutputsDraftForLaterRequests) {
  SuffixProposer p({.max_depth = 8});
  p.start(1, Tokens{100, 101, 102});
  p.append(1, Tokens{1, 2, 3, 4});
  p.append(1, Tokens{5, 6, 7, 8});
  p.finish(1);
  EXPECT_EQ(p.global_tokens(), 8);  // the output only, not the prompt
  EXPECT_EQ(p.num_requests(), 0u);

  Draft d;
  p.start(2, Tokens{50, 1, 2});
  EXPECT_EQ(p.propose(2, 8, d), SuffixSource::Global);
  EXPECT_EQ(d.tokens, (Tokens{3, 4, 5, 6, 7}));  // config.propose.max_tokens (5) caps the request for 8
  float expected = 0.0f, all = 1.0f;
  for (int i = 0; i < 5; ++i) expected += (all *= 0.99f);
  EXPECT_FLOAT_EQ(expected_accepted(d), expected);
  EXPECT_EQ(p.propose(2, 0, d), SuffixSource::None);
  EXPECT_EQ(d.size(), 0);

  // The finished prompt is not in the global tree.
  p.start(3, Tokens{7, 100, 101});
  EXPECT_EQ(p.propose(3, 4, d), SuffixSource::None);

  // Equal expected lengths: the request's own tree is preferred.
  p.start(4, Tokens{1, 2, 3, 4, 9, 1, 2});
  EXPECT_EQ(p.propose(4, 2, d), SuffixSource::Request);
  EXPECT_EQ(d.tokens, (Tokens{3, 4}));
  // "1 2 3 4" went on with 9 here and 5 globally; both walks stop at max_depth 8.
  p.append(4, Tokens{3, 4});
  EXPECT_EQ(p.propose(4, 5, d), SuffixSource::Request);
  EXPECT_EQ(d.tokens, (Tokens{9, 1, 2, 3}));

  // An uncertain own draft (3 or 4 after "1 2", half each) loses to a sure global one.
  p.start(5, Tokens{1, 2, 3, 1, 2, 4, 1, 2});
  EXPECT_EQ(p.propose(5, 5, d), SuffixSource::Global);
  EXPECT_EQ(d.tokens, (Tokens{3, 4, 5, 6, 7}));
}

TEST(SuffixProposer, EvictsTheOldestOutputsToStayWithinTheBound) {
  SuffixProposer p({.max_depth = 6, .global_max_tokens = 10});
  Draft d;
  for (uint64_t id = 0; id < 6; ++id) {
    p.start(id, Tokens{0});
    const auto base = static_cast<int32_t>(10 * id);
    p.append(id, Tokens{base + 1, base + 2, base + 3, base + 4});
    p.finish(id);
    EXPECT_LE(p.global_tokens(), 10);
  }
  EXPECT_EQ(p.global_tokens(), 8);  // the two newest outputs
  p.start(100, Tokens{51, 52});
  EXPECT_EQ(p.propose(100, 5, d), SuffixSource::Global);
  p.start(101, Tokens{31, 32});  // evicted
  EXPECT_EQ(p.propose(101, 5, d), SuffixSource::None);

  // An output above the whole budget keeps its newest tokens only.
  p.start(7, Tokens{});
  Tokens longer(15);
  for (size_t i = 0; i < longer.size(); ++i) longer[i] = 200 + static_cast<int32_t>(i);
  p.append(7, longer);
  p.finish(7);
  EXPECT_EQ(p.global_tokens(), 10);
  p.start(102, Tokens{205, 206});
  EXPECT_EQ(p.propose(102, 5, d), SuffixSource::Global);
  p.start(103, Tokens{203, 204});
  EXPECT_EQ(p.propose(103, 5, d), SuffixSource::None);

  // A budget of 0 disables the global tree.
  SuffixProposer off({.global_max_tokens = 0});
  off.start(1, Tokens{});
  off.append(1, Tokens{1, 2, 3});
  off.finish(1);
  EXPECT_EQ(off.global_tokens(), 0);
  EXPECT_EQ(off.global_nodes(), 0u);
}

TEST(SuffixProposer, RejectsUnknownRequestsAndBadConfigurations) {
  SuffixProposer p({});
  Draft d;
  EXPECT_THROW(p.append(9, Tokens{1}), Error);
  EXPECT_THROW(p.propose(9, 3, d), Error);
  EXPECT_THROW(p.finish(9), Error);
  p.start(9, Tokens{1});
  EXPECT_THROW(p.start(9, Tokens{1}), Error);
  p.finish(9);
  EXPECT_THROW(p.finish(9), Error);

  EXPECT_THROW(SuffixProposer({.max_depth = 1}), Error);
  EXPECT_THROW(SuffixProposer({.max_depth = 257}), Error);
  EXPECT_THROW(SuffixProposer({.propose = {.min_match = 0}}), Error);
  EXPECT_THROW(SuffixProposer({.propose = {.min_match = 3, .max_match = 2}}), Error);
  EXPECT_THROW(SuffixProposer({.propose = {.min_prob = -0.1f}}), Error);
  EXPECT_THROW(SuffixProposer({.global_max_tokens = -1}), Error);
}

}  // namespace
}  // namespace deepinfer::spec
