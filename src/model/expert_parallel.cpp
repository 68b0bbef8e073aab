#include "model/expert_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/tensor_parallel.h"
#include "ops/ops.h"

namespace deepinfer {

namespace {

// Bytes of one expert of a stack [experts, ...] once contiguous.
size_t expert_bytes(const Tensor& stack) {
  size_t bytes = row_bytes(stack.dtype(), stack.size(-1));
  for (int d = 1; d + 1 < stack.ndim(); ++d) bytes *= static_cast<size_t>(stack.size(d));
  return bytes;
}

// Expert e of `stack` (any strides outside its innermost rows) into dst.
void copy_expert(const Tensor& stack, int64_t e, uint8_t* dst) {
  const Tensor x = stack.row(e);
  const size_t row = row_bytes(x.dtype(), x.size(-1));
  if (x.ndim() == 1) {
    std::memcpy(dst, x.data(), row);
    return;
  }
  DI_CHECK(x.ndim() == 2, "expert parallelism: expert tensors are matrices or vectors, got {}", stack.describe());
  for (int64_t r = 0; r < x.size(0); ++r) {
    std::memcpy(dst + static_cast<size_t>(r) * row, static_cast<const char*>(x.data()) + r * x.stride_bytes(0), row);
  }
}

Tensor host_tensor(void* data, DType dtype, const std::vector<int64_t>& shape) {
  return Tensor(data, dtype, std::span<const int64_t>(shape.data(), shape.size()));
}

}  // namespace

ExpertParallelMoe::ExpertParallelMoe(Backend& backend, Communicator& experts, Communicator* token_group)
    : backend_(backend), comm_(experts), token_group_(token_group != nullptr && token_group->size() > 1 ? token_group
                                                                                                     : nullptr) {
  DI_CHECK(backend.device().type == DeviceType::CPU && backend.reads_host_weights(),
           "--enable-expert-parallel runs on the CPU backend for now (the GPU dispatch is not built yet)");
  DI_CHECK(token_group_ == nullptr || experts.size() % token_group_->size() == 0,
           "expert parallelism: {} ranks of experts do not split into token groups of {}", experts.size(),
           token_group_ != nullptr ? token_group_->size() : 1);
}

std::unique_ptr<ExpertParallelMoe> ExpertParallelMoe::for_ranks(Backend& backend, const TensorParallel& tp) {
  if (!tp.expert_parallel()) return nullptr;
  // Tensor-parallel ranks hold the same tokens; data-parallel ranks their own.
  return std::make_unique<ExpertParallelMoe>(backend, *tp.experts, tp.active() ? tp.comm : nullptr);
}

int ExpertParallelMoe::num_ranks() const { return comm_.size(); }

std::vector<float>& ExpertParallelMoe::scratch(size_t i, size_t floats) {
  if (scratch_.size() <= i) scratch_.resize(i + 1);
  if (scratch_[i].size() < floats) scratch_[i].resize(floats);
  return scratch_[i];
}

void ExpertParallelMoe::add_layer(const MoeExpertWeights& full, moe::ExpertPlacement placement) {
  DI_CHECK(placement.num_ranks() == comm_.size() && placement.num_logical() == full.gate.size(0),
           "expert parallelism: a placement of {} experts over {} ranks for {} experts over {} ranks",
           placement.num_logical(), placement.num_ranks(), full.gate.size(0), comm_.size());
  Layer l;
  l.placement = std::move(placement);
  for (const Tensor* t : {&full.gate, &full.up, &full.down, &full.gate_bias, &full.up_bias, &full.down_bias}) {
    if (!t->defined()) break;  // the biases come together or not at all
    l.full_shapes.push_back(*t);
  }
  const int32_t spr = l.placement.slots_per_rank(), first = comm_.rank() * spr;
  for (const Tensor& t : l.full_shapes) {
    Stack s;
    s.slot_bytes = expert_bytes(t);
    s.bytes.resize(s.slot_bytes * static_cast<size_t>(spr));
    for (int32_t k = 0; k < spr; ++k) {
      copy_expert(t, l.placement.physical_to_logical()[static_cast<size_t>(first + k)],
                  s.bytes.data() + static_cast<size_t>(k) * s.slot_bytes);
    }
    l.stacks.push_back(std::move(s));
  }
  build_views(l);
  layers_.push_back(std::move(l));
}

void ExpertParallelMoe::build_views(Layer& l) const {
  const int64_t spr = l.placement.slots_per_rank();
  Tensor* views[] = {&l.local.gate, &l.local.up, &l.local.down, &l.local.gate_bias, &l.local.up_bias,
                     &l.local.down_bias};
  for (size_t i = 0; i < l.stacks.size(); ++i) {
    std::vector<int64_t> shape(l.full_shapes[i].shape().begin(), l.full_shapes[i].shape().end());
    shape[0] = spr;
    *views[i] = host_tensor(l.stacks[i].bytes.data(), l.full_shapes[i].dtype(), shape);
  }
}

void ExpertParallelMoe::forward(size_t layer, const layers::MoeWeights& w, const MoeRouteParams& route,
                                Activation act, const Tensor& h, Tensor out, Tensor expert_counts,
                                const Tensor& token_slots) {
  const Layer& l = layers_.at(layer);
  const moe::ExpertPlacement& p = l.placement;
  const int size = comm_.size(), rank = comm_.rank();
  const int64_t n = h.size(0), hidden = h.size(1), E = p.num_logical(), k = route.top_k;
  DI_CHECK(out.dtype() == DType::F32 && h.dtype() == DType::F32 && out.is_contiguous(),
           "expert parallelism: f32 activations expected, got {} -> {}", h.describe(), out.describe());
  const bool per_rank = token_group_ == nullptr;
  const int group_size = per_rank ? 1 : token_group_->size(), group_rank = per_rank ? 0 : token_group_->rank();
  const IndexRange mine = split_range(n, group_size, group_rank, 1);
  const int64_t m = mine.size();
  const Tensor hm = h.slice_rows(mine.begin, m);

  // 1. Route this rank's tokens.
  Tensor logits = host_tensor(scratch(0, static_cast<size_t>(std::max<int64_t>(m, 1) * E)).data(), DType::F32,
                              {m, E});
  ids_.resize(static_cast<size_t>(m * k));
  std::vector<int32_t>& ids = ids_;
  Tensor ids_t = host_tensor(ids.data(), DType::I32, {m, k});
  Tensor weights_t = host_tensor(scratch(1, static_cast<size_t>(std::max<int64_t>(m * k, 1))).data(), DType::F32,
                                 {m, k});
  if (m > 0) {
    ops::linear(backend_, hm, w.router, w.router_bias, logits);
    ops::moe_route(backend_, logits, route, ids_t, weights_t);
    if (expert_counts.defined()) {
      const Tensor slots = token_slots.defined() ? token_slots.slice_rows(mine.begin, m) : Tensor();
      ops::count_experts(backend_, ids_t, slots, expert_counts);
    }
  }
  if (expert_counts.defined()) comm_.all_reduce(expert_counts);

  // 2. Each (token, choice) to a replica of its expert, grouped by owner rank.
  const int32_t spr = p.slots_per_rank();
  std::vector<int64_t> send_rows(static_cast<size_t>(size), 0), recv_rows(static_cast<size_t>(size), 0);
  dest_.resize(static_cast<size_t>(m * k));
  slot_.resize(static_cast<size_t>(m * k));
  std::vector<int32_t>& dest = dest_;
  std::vector<int32_t>& slot = slot_;
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const size_t c = static_cast<size_t>(t * k + j);
      // The replica rotates with the token and the token group (the first
      // rank of this rank's), so the copies of a hot expert share its load.
      const int32_t phys = p.route(ids[c], static_cast<uint64_t>(mine.begin + t + rank - group_rank));
      dest[c] = p.rank_of(phys);
      slot[c] = phys - dest[c] * spr;
      ++send_rows[static_cast<size_t>(dest[c])];
    }
  }
  std::vector<int64_t> offset(static_cast<size_t>(size) + 1, 0);
  for (int r = 0; r < size; ++r) offset[static_cast<size_t>(r) + 1] = offset[static_cast<size_t>(r)] + send_rows[static_cast<size_t>(r)];
  const int64_t S = offset.back();
  position_.resize(static_cast<size_t>(m * k));
  std::vector<int64_t>& position = position_;  // where each choice sits in the send order
  std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
  float* send_x = scratch(2, static_cast<size_t>(std::max<int64_t>(S, 1) * hidden)).data();
  send_slot_.resize(static_cast<size_t>(std::max<int64_t>(S, 1)));
  std::vector<int32_t>& send_slot = send_slot_;
  for (int64_t c = 0; c < m * k; ++c) {
    const int64_t at = cursor[static_cast<size_t>(dest[static_cast<size_t>(c)])]++;
    position[static_cast<size_t>(c)] = at;
    send_slot[static_cast<size_t>(at)] = slot[static_cast<size_t>(c)];
    std::memcpy(send_x + at * hidden, hm.data_as<const float>() + (c / k) * (hm.stride_bytes(0) / 4),
                static_cast<size_t>(hidden) * sizeof(float));
  }
  {
    std::vector<int64_t> ones(static_cast<size_t>(size), 1);
    comm_.all_to_all(host_tensor(send_rows.data(), DType::I64, {size, 1}), ones,
                     host_tensor(recv_rows.data(), DType::I64, {size, 1}), ones);
  }
  int64_t R = 0;
  for (int64_t r : recv_rows) R += r;
  float* recv_x = scratch(3, static_cast<size_t>(std::max<int64_t>(R, 1) * hidden)).data();
  recv_slot_.resize(static_cast<size_t>(std::max<int64_t>(R, 1)));
  std::vector<int32_t>& recv_slot = recv_slot_;
  comm_.all_to_all(host_tensor(send_x, DType::F32, {S, hidden}), send_rows,
                   host_tensor(recv_x, DType::F32, {R, hidden}), recv_rows);
  comm_.all_to_all(host_tensor(send_slot.data(), DType::I32, {S, 1}), send_rows,
                   host_tensor(recv_slot.data(), DType::I32, {R, 1}), recv_rows);

  // 3. This rank's experts on what it received (unweighted: the senders weigh).
  float* y = scratch(4, static_cast<size_t>(std::max<int64_t>(R, 1) * hidden)).data();
  if (R > 0) {
    std::vector<float>& ones = scratch(5, static_cast<size_t>(R));
    std::fill(ones.begin(), ones.begin() + R, 1.0f);
    const size_t ws = ops::moe_workspace_bytes(backend_, R, 1, l.local);
    if (workspace_.size() < ws) workspace_.resize(ws);
    ops::moe_experts(backend_, host_tensor(recv_x, DType::F32, {R, hidden}),
                     host_tensor(recv_slot.data(), DType::I32, {R, 1}), host_tensor(ones.data(), DType::F32, {R, 1}),
                     l.local, act, false, host_tensor(workspace_.data(), DType::U8, {static_cast<int64_t>(ws)}),
                     host_tensor(y, DType::F32, {R, hidden}));
  }
  float* back = scratch(6, static_cast<size_t>(std::max<int64_t>(S, 1) * hidden)).data();
  comm_.all_to_all(host_tensor(y, DType::F32, {R, hidden}), recv_rows, host_tensor(back, DType::F32, {S, hidden}),
                   send_rows);

  // 4. This rank's rows: the shared expert, then the routed outputs in choice
  // order; then (replicated tokens) everyone's rows to everyone.
  const int64_t rows_max = (n + group_size - 1) / group_size;
  float* own = scratch(7, static_cast<size_t>(std::max<int64_t>(rows_max, 1) * hidden)).data();
  std::fill(own, own + rows_max * hidden, 0.0f);
  const Tensor own_t = host_tensor(own, DType::F32, {m, hidden});
  if (m > 0 && w.shared.gate.defined()) {
    std::vector<float>& gate = scratch(8, static_cast<size_t>(2 * m));
    zero_ids_.assign(static_cast<size_t>(m), 0);
    std::vector<int32_t>& zero_ids = zero_ids_;
    const Tensor gate_logits = host_tensor(gate.data(), DType::F32, {m, 1});
    const Tensor gate_weights = host_tensor(gate.data() + m, DType::F32, {m, 1});
    const Tensor gate_ids = host_tensor(zero_ids.data(), DType::I32, {m, 1});
    ops::linear(backend_, hm, w.shared_gate, Tensor(), gate_logits);
    MoeRouteParams gate_route;
    gate_route.scoring = MoeScoring::Sigmoid;
    ops::moe_route(backend_, gate_logits, gate_route, gate_ids, gate_weights);
    const size_t ws = ops::moe_workspace_bytes(backend_, m, 1, w.shared);
    if (workspace_.size() < ws) workspace_.resize(ws);
    ops::moe_experts(backend_, hm, gate_ids, gate_weights, w.shared, act, false,
                     host_tensor(workspace_.data(), DType::U8, {static_cast<int64_t>(ws)}), own_t);
  }
  const float* wt = weights_t.data_as<const float>();
  for (int64_t t = 0; t < m; ++t) {
    float* o = own + t * hidden;
    for (int64_t j = 0; j < k; ++j) {
      const float wj = wt[t * k + j];
      const float* r = back + position[static_cast<size_t>(t * k + j)] * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += wj * r[c];
    }
  }
  if (per_rank) {
    if (m > 0) std::memcpy(out.data_as<float>(), own, static_cast<size_t>(m * hidden) * sizeof(float));
    return;
  }
  float* all = scratch(9, static_cast<size_t>(std::max<int64_t>(rows_max, 1) * hidden * group_size)).data();
  token_group_->all_gather(host_tensor(own, DType::F32, {rows_max * hidden}),
                           host_tensor(all, DType::F32, {rows_max * hidden * group_size}));
  for (int r = 0; r < group_size; ++r) {
    const IndexRange rr = split_range(n, group_size, r, 1);
    std::memcpy(out.data_as<float>() + rr.begin * hidden, all + static_cast<int64_t>(r) * rows_max * hidden,
                static_cast<size_t>(rr.size() * hidden) * sizeof(float));
  }
}

void ExpertParallelMoe::set_placement(size_t layer, moe::ExpertPlacement next) {
  DI_CHECK(layer < layers_.size(), "expert parallelism: no MoE layer {} (of {})", layer, layers_.size());
  Layer& l = layers_[layer];
  const moe::ExpertPlacement& old = l.placement;
  DI_CHECK(next.num_logical() == old.num_logical() && next.num_ranks() == old.num_ranks(),
           "expert parallelism: a placement of {} experts over {} ranks replaces one of {} over {}",
           next.num_logical(), next.num_ranks(), old.num_logical(), old.num_ranks());
  const int me = comm_.rank();
  const int32_t old_spr = old.slots_per_rank(), new_spr = next.slots_per_rank();
  std::vector<Stack> fresh(l.stacks.size());
  for (size_t i = 0; i < l.stacks.size(); ++i) {
    fresh[i].slot_bytes = l.stacks[i].slot_bytes;
    fresh[i].bytes.resize(fresh[i].slot_bytes * static_cast<size_t>(new_spr));
  }
  // Every rank walks the same list of new slots. An expert the slot's rank
  // already holds is copied there; any other comes from the first rank that
  // holds it now. Those moves travel in one all-to-all per weight stack, each
  // rank sending exactly the slots its peers take from it (the old stacks
  // stay intact until every slot is filled).
  struct Move {
    int src = 0, dst = 0;
    int32_t from_slot = 0, dst_slot = 0;  // slot numbers on the source and the destination rank
  };
  std::vector<Move> moves;
  const int size = comm_.size();
  for (int32_t phys = 0; phys < next.num_physical(); ++phys) {
    const int32_t e = next.physical_to_logical()[static_cast<size_t>(phys)];
    const int dst = next.rank_of(phys);
    const int32_t dst_slot = phys - dst * new_spr;
    int32_t held = -1;  // the old physical slot of e on rank dst, if any
    for (int32_t q : old.replicas(e)) {
      if (old.rank_of(q) == dst) held = q;
    }
    if (held >= 0) {
      if (me != dst) continue;
      for (size_t i = 0; i < fresh.size(); ++i) {
        std::memcpy(fresh[i].bytes.data() + static_cast<size_t>(dst_slot) * fresh[i].slot_bytes,
                    l.stacks[i].bytes.data() + static_cast<size_t>(held - dst * old_spr) * l.stacks[i].slot_bytes,
                    fresh[i].slot_bytes);
      }
      continue;
    }
    const int32_t from = old.replicas(e).front();
    const int src = old.rank_of(from);
    moves.push_back({src, dst, from - src * old_spr, dst_slot});
  }
  std::vector<int64_t> send_slots(static_cast<size_t>(size), 0), recv_slots(static_cast<size_t>(size), 0);
  for (const Move& m : moves) {
    if (m.src == me) ++send_slots[static_cast<size_t>(m.dst)];
    if (m.dst == me) ++recv_slots[static_cast<size_t>(m.src)];
  }
  if (!moves.empty()) {  // every rank knows the same list: all skip, or all take part
    int64_t n_send = 0, n_recv = 0;
    for (int r = 0; r < size; ++r) n_send += send_slots[static_cast<size_t>(r)], n_recv += recv_slots[static_cast<size_t>(r)];
    std::vector<uint8_t> send, recv;
    for (size_t i = 0; i < fresh.size(); ++i) {
      const size_t bytes = fresh[i].slot_bytes;
      send.resize(std::max<size_t>(1, static_cast<size_t>(n_send) * bytes));
      recv.resize(std::max<size_t>(1, static_cast<size_t>(n_recv) * bytes));
      // Send order: by destination rank, then the list's order; the receiver
      // reads its slots back by source rank in the same order.
      size_t at = 0;
      for (int d = 0; d < size; ++d) {
        for (const Move& m : moves) {
          if (m.src != me || m.dst != d) continue;
          std::memcpy(send.data() + at * bytes, l.stacks[i].bytes.data() + static_cast<size_t>(m.from_slot) * bytes,
                      bytes);
          ++at;
        }
      }
      const auto b = static_cast<int64_t>(bytes);
      comm_.all_to_all(host_tensor(send.data(), DType::U8, {n_send, b}), send_slots,
                       host_tensor(recv.data(), DType::U8, {n_recv, b}), recv_slots);
      at = 0;
      for (int src = 0; src < size; ++src) {
        for (const Move& m : moves) {
          if (m.dst != me || m.src != src) continue;
          std::memcpy(fresh[i].bytes.data() + static_cast<size_t>(m.dst_slot) * bytes, recv.data() + at * bytes, bytes);
          ++at;
        }
      }
    }
  }
  l.stacks = std::move(fresh);
  l.placement = std::move(next);
  build_views(l);
}

}  // namespace deepinfer
