// The flat tables behind the tokenizer: tok::Vocab (text <-> id) and tok::MergeTable
// (pair of ids -> rank and merged id), with enough entries that probes collide.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/merge_table.h"
#include "tokenizer/vocab.h"

namespace deepinfer::tok {
namespace {

std::vector<std::string> numbered(size_t n) {
  std::vector<std::string> texts;
  for (size_t i = 0; i < n; ++i) texts.push_back("tok" + std::to_string(i * 7919 % 100003));
  return texts;
}

std::vector<std::string_view> views(const std::vector<std::string>& texts) { return {texts.begin(), texts.end()}; }

TEST(Vocab, FindsEveryTokenAndRejectsOthers) {
  auto texts = numbered(20000);
  Vocab vocab(views(texts));
  ASSERT_EQ(vocab.size(), texts.size());
  for (size_t id = 0; id < texts.size(); ++id) {
    EXPECT_EQ(vocab[id], texts[id]);
    EXPECT_EQ(vocab.find(texts[id]), static_cast<int32_t>(id));
  }
  EXPECT_FALSE(vocab.find("tok").has_value());
  EXPECT_FALSE(vocab.find("tok100003").has_value());
  EXPECT_FALSE(vocab.find("").has_value());
  EXPECT_FALSE(vocab.find(std::string_view("tok1\0", 5)).has_value());
}

TEST(Vocab, EmptyTextsAreHolesAndRepeatsKeepTheFirstId) {
  std::vector<std::string> texts = {"", "a", "b", "a", "", "\xe2\x96\x81", "b"};
  Vocab vocab(views(texts));
  EXPECT_EQ(vocab.size(), 7u);
  EXPECT_EQ(vocab[0], "");
  EXPECT_EQ(vocab[4], "");
  EXPECT_EQ(vocab[3], "a");
  EXPECT_EQ(vocab.find("a"), 1);
  EXPECT_EQ(vocab.find("b"), 2);
  EXPECT_EQ(vocab.find("\xe2\x96\x81"), 5);
  EXPECT_FALSE(vocab.find("").has_value());
}

TEST(Vocab, DefaultConstructedIsEmpty) {
  Vocab vocab;
  EXPECT_EQ(vocab.size(), 0u);
  EXPECT_FALSE(vocab.find("a").has_value());
}

TEST(Vocab, ViewsSurviveAMove) {
  std::vector<std::string> texts = {"x", "yz"};  // short enough for any small-buffer storage
  Vocab vocab(views(texts));
  std::string_view before = vocab[1];
  Vocab moved = std::move(vocab);
  EXPECT_EQ(before.data(), moved[1].data());
  EXPECT_EQ(moved.find("yz"), 1);
}

TEST(MergeTable, FindsEveryPairAtFullLoad) {
  const int32_t n = 30000;
  MergeTable table(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) table.insert_or_assign(i % 173, i, {i, n + i});
  for (int32_t i = 0; i < n; ++i) {
    const auto* v = table.find(i % 173, i);
    ASSERT_NE(v, nullptr) << i;
    EXPECT_EQ(v->rank, i);
    EXPECT_EQ(v->merged, n + i);
  }
  EXPECT_EQ(table.find(0, 1), nullptr);  // 1 % 173 != 0
  EXPECT_EQ(table.find(n, n), nullptr);
}

TEST(MergeTable, ARepeatedPairKeepsItsLastValue) {
  MergeTable table(2);
  table.insert_or_assign(1, 2, {0, 5});
  table.insert_or_assign(1, 2, {1, 6});
  const auto* v = table.find(1, 2);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->rank, 1);
  EXPECT_EQ(v->merged, 6);
  EXPECT_EQ(table.find(2, 1), nullptr);
}

TEST(MergeTable, DefaultConstructedFindsNothing) {
  MergeTable table;
  EXPECT_EQ(table.find(0, 0), nullptr);
}

}  // namespace
}  // namespace deepinfer::tok
