#include "tokenizer/bpe_model.h"

#include <fmt/format.h>

#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tok {

BpeModel::BpeModel(Vocab vocab, const std::vector<BpeMerge>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), merges_(merges.size()), options_(std::move(options)) {
  const auto n = static_cast<int32_t>(vocab_.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    DI_CHECK(m.left >= 0 && m.left < n && m.right >= 0 && m.right < n && m.merged >= 0 && m.merged < n,
             "tokenizer: merge {} refers to an id outside the vocabulary", rank);
    // A repeated pair keeps its last rank, as tokenizers' map construction does.
    merges_.insert_or_assign(m.left, m.right, {static_cast<int32_t>(rank), m.merged});
  }
  if (options_.unk_id) {
    DI_CHECK(*options_.unk_id >= 0 && *options_.unk_id < n, "tokenizer: unknown-token id {} out of range", *options_.unk_id);
  }
  for (int b = 0; b < 256; ++b) {
    auto id = find(fmt::format("<0x{:02X}>", b));
    byte_fallback_ids_[b] = id ? *id : -1;
  }
}

void BpeModel::set_byte_level_input() {
  DI_CHECK(options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty(),
           "tokenizer: byte-level BPE with subword prefixes/suffixes is not supported");
  byte_level_input_ = true;
  const auto& table = byte_level_table();
  for (int b = 0; b < 256; ++b) {
    auto id = find(table.byte_to_utf8[b]);
    byte_level_ids_[b] = id ? *id : -1;
  }
  if (options_.ignore_merges) {
    std::vector<std::string> raw(vocab_.size());
    for (size_t id = 0; id < vocab_.size(); ++id) {
      if (!vocab_[id].empty() && !byte_level_decode(vocab_[id], raw[id])) raw[id].clear();
    }
    raw_vocab_ = Vocab(std::vector<std::string_view>(raw.begin(), raw.end()));
  }
}

void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  std::optional<int32_t> pending_unk;  // fused run of unknown characters
  auto push = [&](int32_t id) { symbols.push_back(Symbol{id, 0, 0, true}); };
  auto flush_unk = [&] {
    if (pending_unk) push(*pending_unk);
    pending_unk.reset();
  };
  auto unknown = [&](std::string_view bytes) {
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char c : bytes) all &= byte_fallback_ids_[c] >= 0;
      if (all) {
        flush_unk();
        for (unsigned char c : bytes) push(byte_fallback_ids_[c]);
        return;
      }
    }
    if (!options_.unk_id) return;  // no unknown token: the character is dropped, as in tokenizers
    if (pending_unk && !options_.fuse_unk) flush_unk();
    pending_unk = options_.unk_id;
  };

  if (byte_level_input_) {
    const auto& table = byte_level_table();
    for (unsigned char c : word) {
      int32_t id = byte_level_ids_[c];
      if (id >= 0) {
        flush_unk();
        push(id);
      } else {
        unknown(table.byte_to_utf8[c]);
      }
    }
    flush_unk();
    return;
  }

  const bool affixes = !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  std::string buf;
  size_t pos = 0;
  while (pos < word.size()) {
    size_t begin = pos;
    utf8_next(word, pos);
    std::string_view ch = word.substr(begin, pos - begin);
    std::optional<int32_t> id;
    if (affixes) {
      buf.clear();
      if (begin > 0) buf += options_.continuing_subword_prefix;
      buf += ch;
      if (pos == word.size()) buf += options_.end_of_word_suffix;
      id = find(buf);
      if (!id) {
        unknown(buf);
        continue;
      }
    } else {
      id = find(ch);
      if (!id) {
        unknown(ch);
        continue;
      }
    }
    flush_unk();
    push(*id);
  }
  flush_unk();
}

void BpeModel::merge_symbols(std::vector<Symbol>& symbols) const {
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue(std::greater<Candidate>(),
                                                                                        std::move(storage));
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = find_merge(symbols[i].id, symbols[i + 1].id)) queue.push({m->rank, i, m->merged});
  }
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale entry: one side was merged away since it was queued.
    const auto* m = find_merge(left.id, right.id);
    if (!m || m->merged != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const auto* pm = find_merge(symbols[left.prev].id, left.id)) queue.push({pm->rank, left.prev, pm->merged});
    }
    if (left.next >= 0) {
      if (const auto* nm = find_merge(left.id, symbols[left.next].id)) queue.push({nm->rank, top.pos, nm->merged});
    }
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (byte_level_input_) {
      if (auto id = raw_vocab_.find(word)) {
        out.push_back(*id);
        return;
      }
    } else if (auto id = find(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  initial_symbols(word, symbols);
  merge_symbols(symbols);
  const size_t start = out.size();
  for (const auto& s : symbols)
    if (s.alive) out.push_back(s.id);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::move(key), std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(start), out.end()));
  }
}

}  // namespace deepinfer::tok
