// Per-render state shared by the interpreter and the builtins: the execution
// budget and its counters, the injectable clock, and the containers a template
// mutated (cleared at the end so reference cycles cannot leak).
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja/value.h"

namespace deepinfer::jinja {

// Limits that keep a hostile template or message from hanging or exhausting the
// process. Every limit, when hit, fails the render with a deepinfer::Error.
struct RenderBudget {
  uint64_t max_steps = 2'000'000;          // statements and expressions evaluated
  uint64_t max_loop_iterations = 200'000;  // for-loop iterations, all loops together
  size_t max_output_bytes = 4u << 20;      // rendered text (and any captured block)
  size_t max_string_bytes = 4u << 20;      // one string or list produced by one operation
  uint64_t max_work_bytes = 256u << 20;    // bytes produced by all string operations together
  int max_call_depth = 32;                 // nested macro calls
  int max_eval_depth = 512;                // nested expression/statement evaluation
};

// Returns the local time used by strftime_now(); injectable so tests are deterministic.
using NowFn = std::function<std::tm()>;
std::tm local_now();

// raise_exception(msg) in a template: the message is the template author's, so it is
// passed to the caller verbatim.
class TemplateRaisedError : public Error {
 public:
  explicit TemplateRaisedError(const std::string& message) : Error(message) {}
};

class RenderContext {
 public:
  RenderContext(const RenderBudget& budget, NowFn now) : budget_(budget), now_(std::move(now)) {}
  ~RenderContext();
  RenderContext(const RenderContext&) = delete;
  RenderContext& operator=(const RenderContext&) = delete;

  const RenderBudget& budget() const { return budget_; }
  std::tm now() const { return now_ ? now_() : local_now(); }

  void step() {
    if (++steps_ > budget_.max_steps) fail("budget exceeded: more than {} evaluation steps", budget_.max_steps);
  }
  void count_iteration() {
    if (++iterations_ > budget_.max_loop_iterations) {
      fail("budget exceeded: more than {} loop iterations", budget_.max_loop_iterations);
    }
  }
  // Called before producing a string (or list) of `size` bytes (items).
  void check_size(size_t size) {
    if (size > budget_.max_string_bytes) {
      fail("budget exceeded: a single value of {} bytes/items (limit {})", size, budget_.max_string_bytes);
    }
    work_bytes_ += size;
    if (work_bytes_ > budget_.max_work_bytes) {
      fail("budget exceeded: string operations produced more than {} bytes", budget_.max_work_bytes);
    }
  }
  // Remembers a container the template mutated (namespace attribute, list.append).
  void note_mutation(const Value& container) { mutated_.push_back(container); }

 private:
  const RenderBudget& budget_;
  NowFn now_;
  uint64_t steps_ = 0;
  uint64_t iterations_ = 0;
  uint64_t work_bytes_ = 0;
  std::vector<Value> mutated_;
};

}  // namespace deepinfer::jinja
