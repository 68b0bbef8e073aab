#include "sched/step_plan_wire.h"

#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace deepinfer {

namespace {

constexpr uint32_t kMagic = 0x31505344;  // "DSP1"
// Far above any real step; bounds what a count read from the bytes may ask for.
constexpr uint64_t kMaxItems = uint64_t{1} << 26;

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    put(static_cast<uint64_t>(v.size()));
    for (const T& x : v) put(x);
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    DI_CHECK(bytes_.size() - at_ >= sizeof(T), "step plan: truncated at byte {} of {}", at_, bytes_.size());
    T v;
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  uint64_t count(size_t item_bytes) {
    const auto n = get<uint64_t>();
    DI_CHECK(n <= kMaxItems && n * item_bytes <= bytes_.size() - at_,
             "step plan: a count of {} items does not fit the {} bytes left", n, bytes_.size() - at_);
    return n;
  }
  template <typename T>
  std::vector<T> get_vector() {
    const uint64_t n = count(sizeof(T));
    std::vector<T> v(n);
    for (T& x : v) x = get<T>();
    return v;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

// Explicit fields only (no padding bytes of unknown value on the wire).
struct WireSeq {
  uint64_t request_id;
  int32_t start, num_tokens, token_begin, row_begin, num_rows, reserved;
};
static_assert(sizeof(WireSeq) == 32);
struct WireToken {
  int32_t id, slot, row;
};
struct WireRow {
  int32_t seq, query;
  SamplingRowParams params;
};
static_assert(sizeof(WireRow) == 40 && sizeof(WireToken) == 12);

}  // namespace

std::vector<uint8_t> encode_step_plan(const StepPlan& plan) {
  DI_CHECK(!plan.hidden_source.defined() && plan.hidden_rows.empty(),
           "a step with a hidden input (multi-token prediction) cannot be sent to other ranks");
  Writer w;
  w.put(kMagic);
  w.put(plan.page_size);
  w.put(static_cast<uint64_t>(plan.seqs.size()));
  for (const PlannedSeq& s : plan.seqs) {
    w.put(WireSeq{s.request_id, s.start, s.num_tokens, s.token_begin, s.row_begin, s.num_rows, 0});
  }
  w.put(static_cast<uint64_t>(plan.tokens.size()));
  for (const TokenSource& t : plan.tokens) w.put(WireToken{t.id, t.device.slot, t.device.row});
  w.put(static_cast<uint64_t>(plan.rows.size()));
  for (const PlannedRow& r : plan.rows) w.put(WireRow{r.seq, r.query, r.sampling.params});
  w.put(static_cast<uint64_t>(plan.groups.size()));
  for (const GroupPages& g : plan.groups) {
    w.put_vector(g.indptr);
    w.put_vector(g.pages);
    w.put_vector(g.first_pos);
  }
  return w.take();
}

StepPlan decode_step_plan(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  DI_CHECK(r.get<uint32_t>() == kMagic, "step plan: bad magic");
  StepPlan plan;
  plan.page_size = r.get<int32_t>();
  DI_CHECK(plan.page_size > 0, "step plan: page size {}", plan.page_size);
  const uint64_t n_seqs = r.count(sizeof(WireSeq));
  plan.seqs.reserve(n_seqs);
  for (uint64_t i = 0; i < n_seqs; ++i) {
    const auto s = r.get<WireSeq>();
    plan.seqs.push_back({s.request_id, s.start, s.num_tokens, s.token_begin, s.row_begin, s.num_rows});
  }
  const uint64_t n_tokens = r.count(sizeof(WireToken));
  plan.tokens.reserve(n_tokens);
  for (uint64_t i = 0; i < n_tokens; ++i) {
    const auto t = r.get<WireToken>();
    DI_CHECK(t.slot >= -1 && (t.slot < 0 || t.row >= 0), "step plan: token {} names slot {} row {}", i, t.slot, t.row);
    plan.tokens.push_back(t.slot >= 0 ? TokenSource::sampled({t.slot, t.row}) : TokenSource::host(t.id));
  }
  const uint64_t n_rows = r.count(sizeof(WireRow));
  plan.rows.reserve(n_rows);
  for (uint64_t i = 0; i < n_rows; ++i) {
    const auto w = r.get<WireRow>();
    DI_CHECK(w.seq >= 0 && static_cast<uint64_t>(w.seq) < n_seqs, "step plan: row {} names sequence {}", i, w.seq);
    const PlannedSeq& s = plan.seqs[static_cast<size_t>(w.seq)];
    DI_CHECK(w.query >= 0 && w.query < s.num_tokens, "step plan: row {} names query {} of {}", i, w.query,
             s.num_tokens);
    PlannedRow row{w.seq, w.query, {}};
    row.sampling.params = w.params;
    plan.rows.push_back(row);
  }
  for (const PlannedSeq& s : plan.seqs) {
    DI_CHECK(s.start >= 0 && s.num_tokens > 0 && s.token_begin >= 0 &&
                 static_cast<uint64_t>(s.token_begin) + static_cast<uint64_t>(s.num_tokens) <= n_tokens &&
                 s.row_begin >= 0 && s.num_rows >= 0 &&
                 static_cast<uint64_t>(s.row_begin) + static_cast<uint64_t>(s.num_rows) <= n_rows,
             "step plan: sequence {} has tokens [{}, +{}) / rows [{}, +{}) outside the plan's {} / {}", s.request_id,
             s.token_begin, s.num_tokens, s.row_begin, s.num_rows, n_tokens, n_rows);
  }
  const uint64_t n_groups = r.count(3 * sizeof(uint64_t));
  DI_CHECK(n_groups >= 1, "step plan: no KV group");
  plan.groups.resize(n_groups);
  for (GroupPages& g : plan.groups) {
    g.indptr = r.get_vector<int32_t>();
    g.pages = r.get_vector<int32_t>();
    g.first_pos = r.get_vector<int32_t>();
    DI_CHECK(g.indptr.size() == n_seqs + 1 && g.first_pos.size() == n_seqs && g.indptr.front() == 0 &&
                 static_cast<size_t>(g.indptr.back()) == g.pages.size(),
             "step plan: a KV group's page table does not match its {} sequences", n_seqs);
    for (size_t i = 0; i + 1 < g.indptr.size(); ++i) {
      DI_CHECK(g.indptr[i] <= g.indptr[i + 1], "step plan: page table offsets decrease at sequence {}", i);
    }
  }
  DI_CHECK(r.done(), "step plan: trailing bytes");
  return plan;
}

}  // namespace deepinfer
