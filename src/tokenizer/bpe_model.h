// Byte-pair-encoding model: merges ranked pairs of adjacent symbols inside one
// pre-tokenized word, exactly as Hugging Face tokenizers' BPE model does
// (lowest rank first, leftmost on ties), with byte fallback and unknown tokens.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/merge_table.h"
#include "tokenizer/vocab.h"

namespace deepinfer::tok {

struct BpeOptions {
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

struct BpeMerge {
  int32_t left = 0, right = 0, merged = 0;  // token ids; rank = index in the list
};

class BpeModel {
 public:
  // vocab[id] is the token text ("" for ids the model does not define).
  BpeModel(Vocab vocab, const std::vector<BpeMerge>& merges, BpeOptions options);

  // Words arrive as raw bytes and every byte is looked up as its GPT-2 byte-level
  // character (set when the ByteLevel pre-tokenizer's mapping is deferred to here).
  void set_byte_level_input();

  // Appends the ids of one word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab() const { return vocab_; }
  std::optional<int32_t> find(std::string_view token) const { return vocab_.find(token); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  const MergeTable::Value* find_merge(int32_t a, int32_t b) const { return merges_.find(a, b); }
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;
  void merge_symbols(std::vector<Symbol>& symbols) const;

  Vocab vocab_;
  MergeTable merges_;
  BpeOptions options_;
  std::array<int32_t, 256> byte_fallback_ids_{};  // <0xXX> tokens, -1 if missing

  bool byte_level_input_ = false;
  std::array<int32_t, 256> byte_level_ids_{};  // id of each byte's byte-level character
  Vocab raw_vocab_;                            // raw bytes of each token (ignore_merges)

  // Results for short words: most text repeats a small set of words.
  static constexpr size_t kMaxCachedWordBytes = 48;
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace deepinfer::tok
