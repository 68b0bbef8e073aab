#include "kv/block_pool.h"

#include "core/error.h"

namespace deepinfer {

BlockPool::BlockPool(int32_t num_blocks) {
  DI_CHECK(num_blocks >= 0, "BlockPool: negative number of blocks ({})", num_blocks);
  blocks_.resize(static_cast<size_t>(num_blocks));
  for (int32_t id = 0; id < num_blocks; ++id) push_tail(id);
}

void BlockPool::check_id(int32_t block_id) const {
  DI_CHECK(block_id >= 0 && block_id < num_blocks(), "BlockPool: block id {} out of range [0, {})", block_id,
           num_blocks());
}

void BlockPool::push_tail(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  b.prev = tail_;
  b.next = kNone;
  b.in_free_queue = true;
  if (tail_ == kNone) {
    head_ = id;
  } else {
    blocks_[static_cast<size_t>(tail_)].next = id;
  }
  tail_ = id;
  ++num_free_;
}

void BlockPool::unlink(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.prev == kNone) {
    head_ = b.next;
  } else {
    blocks_[static_cast<size_t>(b.prev)].next = b.next;
  }
  if (b.next == kNone) {
    tail_ = b.prev;
  } else {
    blocks_[static_cast<size_t>(b.next)].prev = b.prev;
  }
  b.prev = kNone;
  b.next = kNone;
  b.in_free_queue = false;
  --num_free_;
}

std::optional<std::vector<int32_t>> BlockPool::allocate(int32_t n) {
  DI_CHECK(n >= 0, "BlockPool: cannot allocate a negative number of blocks ({})", n);
  if (n > num_free_) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = head_;
    unlink(id);
    blocks_[static_cast<size_t>(id)].refcount = 1;
    if (listener_ != nullptr) listener_->on_block_reuse(id);
    ids.push_back(id);
  }
  return ids;
}

void BlockPool::ref(int32_t block_id) {
  check_id(block_id);
  Block& b = blocks_[static_cast<size_t>(block_id)];
  if (b.refcount == 0) unlink(block_id);
  ++b.refcount;
}

void BlockPool::release(int32_t block_id) {
  check_id(block_id);
  Block& b = blocks_[static_cast<size_t>(block_id)];
  DI_CHECK(b.refcount > 0, "BlockPool: release of block {} which is already free", block_id);
  if (--b.refcount == 0) push_tail(block_id);
}

void BlockPool::release(std::span<const int32_t> block_ids) {
  for (int32_t id : block_ids) release(id);
}

int32_t BlockPool::refcount(int32_t block_id) const {
  check_id(block_id);
  return blocks_[static_cast<size_t>(block_id)].refcount;
}

double BlockPool::usage() const {
  if (blocks_.empty()) return 0.0;
  return static_cast<double>(num_blocks() - num_free_) / static_cast<double>(num_blocks());
}

std::vector<int32_t> BlockPool::free_queue() const {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(num_free_));
  for (int32_t id = head_; id != kNone && ids.size() <= blocks_.size();
       id = blocks_[static_cast<size_t>(id)].next) {
    ids.push_back(id);
  }
  return ids;
}

void BlockPool::check_integrity() const {
  const int32_t n = num_blocks();
  DI_CHECK(num_free_ >= 0 && num_free_ <= n, "BlockPool integrity: free count {} outside [0, {}]", num_free_, n);
  DI_CHECK((head_ == kNone) == (tail_ == kNone), "BlockPool integrity: head {} and tail {} disagree on emptiness",
           head_, tail_);
  int32_t walked = 0;
  int32_t prev = kNone;
  for (int32_t id = head_; id != kNone; id = blocks_[static_cast<size_t>(id)].next) {
    DI_CHECK(id >= 0 && id < n, "BlockPool integrity: free queue link to invalid id {}", id);
    DI_CHECK(walked < n, "BlockPool integrity: free queue has a cycle");
    const Block& b = blocks_[static_cast<size_t>(id)];
    DI_CHECK(b.in_free_queue, "BlockPool integrity: block {} is linked in the free queue but not flagged", id);
    DI_CHECK(b.refcount == 0, "BlockPool integrity: block {} in the free queue has refcount {}", id, b.refcount);
    DI_CHECK(b.prev == prev, "BlockPool integrity: block {} has prev {} but follows {}", id, b.prev, prev);
    prev = id;
    ++walked;
  }
  DI_CHECK(prev == tail_, "BlockPool integrity: queue ends at {} but tail is {}", prev, tail_);
  DI_CHECK(walked == num_free_, "BlockPool integrity: {} blocks in the free queue but free count is {}", walked,
           num_free_);
  int32_t flagged = 0;
  for (int32_t id = 0; id < n; ++id) {
    const Block& b = blocks_[static_cast<size_t>(id)];
    DI_CHECK(b.refcount >= 0, "BlockPool integrity: block {} has negative refcount {}", id, b.refcount);
    DI_CHECK((b.refcount == 0) == b.in_free_queue,
             "BlockPool integrity: block {} has refcount {} but in_free_queue={}", id, b.refcount, b.in_free_queue);
    if (b.in_free_queue) ++flagged;
  }
  DI_CHECK(flagged == walked, "BlockPool integrity: {} blocks flagged free but {} linked in the free queue", flagged,
           walked);
}

}  // namespace deepinfer
