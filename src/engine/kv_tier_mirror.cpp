#include "engine/kv_tier_mirror.h"

#include <algorithm>
#include <unordered_set>

#include "backend/backend.h"
#include "core/error.h"
#include "core/logging.h"
#include "kv/kv_storage.h"
#include "sched/step_plan.h"

namespace deepinfer {

KvTierMirror::KvTierMirror(Backend& backend, KvStorage& storage, int32_t num_slots)
    : backend_(backend), storage_(storage), num_slots_(num_slots), block_bytes_(storage.bytes_per_block()) {
  DI_CHECK(num_slots > 0 && static_cast<uint64_t>(num_slots) <= (uint64_t{1} << 40) / block_bytes_,
           "kv tiers: a host tier of {} slots of {} bytes", num_slots, block_bytes_);
  host_ = static_cast<std::byte*>(backend_.allocate_host(static_cast<size_t>(num_slots) * block_bytes_));
  copy_stream_ = backend_.create_copy_stream();
  log_info("kv tiers: this rank's slice of the host tier, {} blocks of {} KiB ({:.1f} MiB)", num_slots,
           block_bytes_ / 1024, static_cast<double>(num_slots) * static_cast<double>(block_bytes_) / 1048576.0);
}

KvTierMirror::~KvTierMirror() {
  try {
    copy_stream_->synchronize();
  } catch (const std::exception& e) {
    log_error("kv tiers: host copies failed at shutdown: {}", e.what());
  }
  backend_.deallocate_host(host_);
}

void KvTierMirror::check(const KvSlotCopy& c) const {
  DI_CHECK(c.slot >= 0 && c.slot < num_slots_ && c.block >= 0 && c.block < storage_.num_pages(),
           "kv tiers: a copy between slot {} (of {}) and block {} (of {})", c.slot, num_slots_, c.block,
           storage_.num_pages());
}

std::byte* KvTierMirror::slot(int32_t s) const { return host_ + static_cast<size_t>(s) * block_bytes_; }

template <typename Touches>
void KvTierMirror::wait_for_offloads(Touches touches) {
  size_t last = 0;  // one past the last batch to wait for
  for (size_t i = 0; i < in_flight_.size(); ++i) {
    for (const KvSlotCopy& c : in_flight_[i].copies) {
      if (touches(c)) {
        last = i + 1;
        break;
      }
    }
  }
  if (last > 0) in_flight_[last - 1].done->synchronize();
  in_flight_.erase(in_flight_.begin(), in_flight_.begin() + static_cast<ptrdiff_t>(last));
  while (!in_flight_.empty() && in_flight_.front().done->ready()) in_flight_.erase(in_flight_.begin());
}

void KvTierMirror::offload(std::span<const KvSlotCopy> copies) {
  for (const KvSlotCopy& c : copies) check(c);
  if (copies.empty()) return;
  copy_stream_->wait_for_ops();
  for (const KvSlotCopy& c : copies) storage_.save_block(c.block, slot(c.slot), *copy_stream_);
  in_flight_.push_back({copy_stream_->record(), std::vector<KvSlotCopy>(copies.begin(), copies.end())});
}

void KvTierMirror::load(std::span<const KvSlotCopy> copies) {
  for (const KvSlotCopy& c : copies) check(c);
  std::unordered_set<int32_t> slots, blocks;
  for (const KvSlotCopy& c : copies) slots.insert(c.slot), blocks.insert(c.block);
  wait_for_offloads([&](const KvSlotCopy& o) { return slots.count(o.slot) > 0 || blocks.count(o.block) > 0; });
  for (const KvSlotCopy& c : copies) storage_.load_block(c.block, slot(c.slot));
}

void KvTierMirror::before_step(const StepPlan& plan) {
  if (in_flight_.empty()) return;
  const std::vector<int32_t> written = plan.written_pages();
  wait_for_offloads(
      [&](const KvSlotCopy& o) { return std::binary_search(written.begin(), written.end(), o.block); });
}

}  // namespace deepinfer
