#include "model/expert_parallel.h"

#include <algorithm>

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

Tensor host_tensor(void* data, DType dtype, const std::vector<int64_t>& shape) {
  return Tensor(data, dtype, std::span<const int64_t>(shape.data(), shape.size()));
}

// Slot `slot` of a stack buffer, shaped as one expert of `full` (its dtype,
// so that a backend's own weight layout, e.g. FP8 rows, applies).
Tensor slot_view(const Buffer& b, const Tensor& full, int32_t slot, size_t slot_bytes, Device device) {
  std::vector<int64_t> shape(full.shape().begin() + 1, full.shape().end());
  return Tensor(static_cast<char*>(b.data()) + static_cast<size_t>(slot) * slot_bytes, full.dtype(),
                std::span<const int64_t>(shape.data(), shape.size()), device);
}

}  // namespace

ExpertParallelMoe::ExpertParallelMoe(Backend& backend, Communicator& experts, Communicator* token_group)
    : backend_(backend), comm_(experts), token_group_(token_group != nullptr && token_group->size() > 1 ? token_group
                                                                                                     : nullptr) {
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

Tensor ExpertParallelMoe::scratch(Scratch which, DType dtype, std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> dims(shape);
  size_t bytes = row_bytes(dtype, dims.back());
  for (size_t d = 0; d + 1 < dims.size(); ++d) bytes *= static_cast<size_t>(dims[d]);
  Buffer& b = scratch_[which];
  if (b.size() < std::max<size_t>(bytes, 1)) b = Buffer(backend_, std::max<size_t>({bytes, 2 * b.size(), 256}));
  return Tensor(b.data(), dtype, std::span<const int64_t>(dims.data(), dims.size()), backend_.device());
}

Tensor ExpertParallelMoe::upload(Scratch which, const std::vector<int32_t>& values) {
  const auto n = static_cast<int64_t>(values.size());
  Tensor t = scratch(which, DType::I32, {n});
  if (n > 0) ops::copy(backend_, t, host_tensor(const_cast<int32_t*>(values.data()), DType::I32, {n}));
  return t;
}

std::vector<int64_t> ExpertParallelMoe::exchange_counts(const std::vector<int64_t>& send_rows) {
  const int size = comm_.size();
  std::vector<int64_t> recv_rows(static_cast<size_t>(size), 0);
  const std::vector<int64_t> ones(static_cast<size_t>(size), 1);
  // Through device memory: the group's collectives run on the device.
  Tensor counts = scratch(kCounts, DType::I64, {2 * size, 1});
  const Tensor send = counts.slice_rows(0, size), recv = counts.slice_rows(size, size);
  ops::copy(backend_, send, host_tensor(const_cast<int64_t*>(send_rows.data()), DType::I64, {size, 1}));
  comm_.all_to_all(send, ones, recv, ones);
  ops::copy(backend_, host_tensor(recv_rows.data(), DType::I64, {size, 1}), recv);  // waits for it
  return recv_rows;
}

void ExpertParallelMoe::copy_slot(const Stack& from, int32_t from_slot, Stack& to, int32_t to_slot,
                                  size_t slot_bytes) {
  const auto bytes = static_cast<int64_t>(slot_bytes);
  ops::copy(backend_, to.bytes.view(DType::U8, {bytes}, static_cast<size_t>(to_slot) * slot_bytes),
            from.bytes.view(DType::U8, {bytes}, static_cast<size_t>(from_slot) * slot_bytes));
}

void ExpertParallelMoe::add_layer(const MoeExpertWeights& full, moe::ExpertPlacement placement) {
  DI_CHECK(placement.num_ranks() == comm_.size() && placement.num_logical() == full.gate.size(0),
           "expert parallelism: a placement of {} experts over {} ranks for {} experts over {} ranks",
           placement.num_logical(), placement.num_ranks(), full.gate.size(0), comm_.size());
  Layer l;
  l.placement = std::move(placement);
  for (const Tensor* t : {&full.gate, &full.up, &full.down, &full.gate_bias, &full.up_bias, &full.down_bias}) {
    if (!t->defined()) break;  // the biases come together or not at all
    DI_CHECK(t->ndim() == 2 || t->ndim() == 3, "expert parallelism: expert tensors are matrices or vectors, got {}",
             t->describe());
    // A device keeps the checkpoint's bytes as they are: no dequantisation
    // or packing on the way (WeightStore's), so only plain float types.
    DI_CHECK(backend_.reads_host_weights() || t->dtype() == DType::BF16 || t->dtype() == DType::F16 ||
                 t->dtype() == DType::F32,
             "expert parallelism on {}: {} experts; use a bf16 or f16 checkpoint", backend_.name(),
             dtype_name(t->dtype()));
    l.full_shapes.push_back(*t);
  }
  const int32_t spr = l.placement.slots_per_rank(), first = comm_.rank() * spr;
  for (const Tensor& t : l.full_shapes) {
    Stack s;
    s.slot_bytes = expert_bytes(t);
    s.bytes = Buffer(backend_, s.slot_bytes * static_cast<size_t>(spr));
    for (int32_t k = 0; k < spr; ++k) {
      // The checkpoint's expert (host memory, any row stride) into the slot.
      ops::copy(backend_, slot_view(s.bytes, t, k, s.slot_bytes, backend_.device()),
                t.row(l.placement.physical_to_logical()[static_cast<size_t>(first + k)]));
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
    *views[i] = Tensor(l.stacks[i].bytes.data(), l.full_shapes[i].dtype(),
                       std::span<const int64_t>(shape.data(), shape.size()), backend_.device());
  }
}

void ExpertParallelMoe::forward(size_t layer, const layers::MoeWeights& w, const MoeRouteParams& route,
                                Activation act, const Tensor& h, Tensor out, Tensor expert_counts,
                                const Tensor& token_slots) {
  const Layer& l = layers_.at(layer);
  const moe::ExpertPlacement& p = l.placement;
  const int size = comm_.size(), rank = comm_.rank();
  const int64_t n = h.size(0), hidden = h.size(1), E = p.num_logical(), k = route.top_k;
  const DType dt = h.dtype();
  DI_CHECK(out.dtype() == dt && out.is_contiguous() && out.size(0) == n && out.size(1) == hidden,
           "expert parallelism: activations {} -> {}", h.describe(), out.describe());
  const bool per_rank = token_group_ == nullptr;
  const int group_size = per_rank ? 1 : token_group_->size(), group_rank = per_rank ? 0 : token_group_->rank();
  const IndexRange mine = split_range(n, group_size, group_rank, 1);
  const int64_t m = mine.size();
  const Tensor hm = h.slice_rows(mine.begin, m);

  // 1. Route this rank's tokens (on the device), then bring the ids here.
  const Tensor ids = scratch(kIds, DType::I32, {m, k});
  const Tensor weights = scratch(kWeights, DType::F32, {m * k, 1});
  ids_.resize(static_cast<size_t>(m * k));
  if (m > 0) {
    const Tensor logits = scratch(kLogits, DType::F32, {m, E});
    ops::linear(backend_, hm, w.router, w.router_bias, logits);
    ops::moe_route(backend_, logits, route, ids, weights.reshape({m, k}));
    if (expert_counts.defined()) {
      const Tensor slots = token_slots.defined() ? token_slots.slice_rows(mine.begin, m) : Tensor();
      ops::count_experts(backend_, ids, slots, expert_counts);
    }
    ops::copy(backend_, host_tensor(ids_.data(), DType::I32, {m, k}), ids);  // waits for the route
  }
  if (expert_counts.defined()) comm_.all_reduce(expert_counts);

  // 2. Each (token, choice) to a replica of its expert, grouped by owner
  // rank: the send order, what each sent row is (its token, its choice) and
  // the slot it wants, and where each choice sits in that order.
  const int32_t spr = p.slots_per_rank();
  std::vector<int64_t> send_rows(static_cast<size_t>(size), 0);
  std::vector<int32_t> dest(static_cast<size_t>(m * k)), slot(static_cast<size_t>(m * k));
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const size_t c = static_cast<size_t>(t * k + j);
      // The replica rotates with the token and the token group (the first
      // rank of this rank's), so the copies of a hot expert share its load.
      const int32_t phys = p.route(ids_[c], static_cast<uint64_t>(mine.begin + t + rank - group_rank));
      dest[c] = p.rank_of(phys);
      slot[c] = phys - dest[c] * spr;
      ++send_rows[static_cast<size_t>(dest[c])];
    }
  }
  std::vector<int64_t> cursor(static_cast<size_t>(size), 0);
  for (int r = 1; r < size; ++r) cursor[static_cast<size_t>(r)] = cursor[r - 1] + send_rows[static_cast<size_t>(r) - 1];
  const int64_t S = m * k;  // every choice is sent once
  send_index_.resize(static_cast<size_t>(S));
  send_choice_.resize(static_cast<size_t>(S));
  send_slot_.resize(static_cast<size_t>(S));
  position_.resize(static_cast<size_t>(S));
  for (int64_t c = 0; c < S; ++c) {
    const auto at = static_cast<size_t>(cursor[static_cast<size_t>(dest[static_cast<size_t>(c)])]++);
    position_[static_cast<size_t>(c)] = static_cast<int32_t>(at);
    send_index_[at] = static_cast<int32_t>(c / k);
    send_choice_[at] = static_cast<int32_t>(c);
    send_slot_[at] = slot[static_cast<size_t>(c)];
  }
  const std::vector<int64_t> recv_rows = exchange_counts(send_rows);
  int64_t R = 0;
  for (int64_t r : recv_rows) R += r;

  // 3. The rows, their routing weights and slots to the owners; the owners'
  // experts on what they received, weighted there; the outputs back.
  const Tensor send_x = scratch(kSendX, dt, {S, hidden});
  const Tensor send_w = scratch(kSendW, DType::F32, {S, 1});
  const Tensor send_slot = upload(kSendSlot, send_slot_).reshape({S, 1});
  if (S > 0) {
    ops::gather_rows(backend_, hm, upload(kSendIndex, send_index_), send_x);
    ops::gather_rows(backend_, weights, upload(kSendChoice, send_choice_), send_w);
  }
  const Tensor recv_x = scratch(kRecvX, dt, {R, hidden});
  const Tensor recv_w = scratch(kRecvW, DType::F32, {R, 1});
  const Tensor recv_slot = scratch(kRecvSlot, DType::I32, {R, 1});
  comm_.all_to_all(send_x, send_rows, recv_x, recv_rows);
  comm_.all_to_all(send_w, send_rows, recv_w, recv_rows);
  comm_.all_to_all(send_slot, send_rows, recv_slot, recv_rows);
  const Tensor y = scratch(kY, dt, {R, hidden});
  if (R > 0) {
    const size_t ws = ops::moe_workspace_bytes(backend_, R, 1, l.local);
    const Tensor workspace = scratch(kWorkspace, DType::U8, {static_cast<int64_t>(std::max<size_t>(ws, 1))});
    ops::moe_experts(backend_, recv_x, recv_slot, recv_w, l.local, act, false, workspace, y);
  }
  const Tensor back = scratch(kBack, dt, {S, hidden});
  comm_.all_to_all(y, recv_rows, back, send_rows);

  // 4. This rank's rows: the shared expert, then the routed outputs added in
  // choice order (so the sum does not depend on which replica computed
  // what); then, in a token group, everyone's rows to everyone.
  const int64_t rows_max = (n + group_size - 1) / group_size;
  const Tensor own = per_rank ? out : scratch(kOwn, dt, {rows_max, hidden}).slice_rows(0, m);
  if (m > 0) {
    const Tensor choices = scratch(kGathered, dt, {S, hidden});
    ops::gather_rows(backend_, back, upload(kPosition, position_), choices);
    const Tensor by_token = choices.reshape({m, k * hidden});
    int64_t first = 0;
    if (w.shared.gate.defined()) {
      const Tensor gate = scratch(kSharedGate, DType::F32, {2 * m, 1});
      const Tensor gate_logits = gate.slice_rows(0, m), gate_weights = gate.slice_rows(m, m);
      const Tensor gate_ids = scratch(kIds, DType::I32, {m, 1});  // the routing ids are on the host by now
      ops::linear(backend_, hm, w.shared_gate, Tensor(), gate_logits);
      MoeRouteParams gate_route;
      gate_route.scoring = MoeScoring::Sigmoid;
      ops::moe_route(backend_, gate_logits, gate_route, gate_ids, gate_weights);  // one expert: id 0, sigmoid
      const size_t ws = ops::moe_workspace_bytes(backend_, m, 1, w.shared);
      const Tensor workspace = scratch(kWorkspace, DType::U8, {static_cast<int64_t>(std::max<size_t>(ws, 1))});
      ops::moe_experts(backend_, hm, gate_ids, gate_weights, w.shared, act, false, workspace, own);
    } else {
      ops::copy(backend_, own, by_token.narrow(1, 0, hidden));
      first = 1;
    }
    for (int64_t j = first; j < k; ++j) ops::add(backend_, own, by_token.narrow(1, j * hidden, hidden), own);
  }
  if (per_rank) return;
  const Tensor own_rows = scratch(kOwn, dt, {rows_max, hidden});
  const Tensor all = scratch(kAll, dt, {rows_max * group_size, hidden});
  token_group_->all_gather(own_rows.reshape({rows_max * hidden}), all.reshape({rows_max * group_size * hidden}));
  for (int r = 0; r < group_size; ++r) {
    const IndexRange rr = split_range(n, group_size, r, 1);
    if (rr.size() > 0) ops::copy(backend_, out.slice_rows(rr.begin, rr.size()), all.slice_rows(r * rows_max, rr.size()));
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
    fresh[i].bytes = Buffer(backend_, fresh[i].slot_bytes * static_cast<size_t>(new_spr));
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
        copy_slot(l.stacks[i], held - dst * old_spr, fresh[i], dst_slot, fresh[i].slot_bytes);
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
    for (size_t i = 0; i < fresh.size(); ++i) {
      const size_t bytes = fresh[i].slot_bytes;
      Stack send{Buffer(backend_, std::max<size_t>(1, static_cast<size_t>(n_send) * bytes)), bytes};
      Stack recv{Buffer(backend_, std::max<size_t>(1, static_cast<size_t>(n_recv) * bytes)), bytes};
      // Send order: by destination rank, then the list's order; the receiver
      // reads its slots back by source rank in the same order.
      int32_t at = 0;
      for (int d = 0; d < size; ++d) {
        for (const Move& m : moves) {
          if (m.src == me && m.dst == d) copy_slot(l.stacks[i], m.from_slot, send, at++, bytes);
        }
      }
      const auto b = static_cast<int64_t>(bytes);
      comm_.all_to_all(send.bytes.view(DType::U8, {n_send, b}), send_slots, recv.bytes.view(DType::U8, {n_recv, b}),
                       recv_slots);
      at = 0;
      for (int src = 0; src < size; ++src) {
        for (const Move& m : moves) {
          if (m.dst == me && m.src == src) copy_slot(recv, at++, fresh[i], m.dst_slot, bytes);
        }
      }
    }
  }
  l.stacks = std::move(fresh);
  l.placement = std::move(next);
  build_views(l);
}

}  // namespace deepinfer
