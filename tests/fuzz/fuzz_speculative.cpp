// libFuzzer target: speculative decoding's inputs. Text that starts with '{'
// is a --speculative-config document; anything else is a script of proposer
// operations (start, append, propose, finish) over a small vocabulary, run on
// the n-gram and suffix proposers with a tiny global tree so that finished
// outputs are evicted (and the suffix trees' child tables shrink) all the
// time. Drafts must respect their length limit and carry confidences in
// (0, 1]; any other failure than deepinfer::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "spec/proposer.h"

namespace {

using namespace deepinfer;
using namespace deepinfer::spec;

void check(bool ok) {
  if (!ok) std::abort();
}

void run_script(std::span<const uint8_t> bytes) {
  SpeculativeConfig ngram_config;
  ngram_config.method = SpecMethod::Ngram;
  SpeculativeConfig suffix_config;
  suffix_config.method = SpecMethod::Suffix;
  suffix_config.suffix_max_depth = 6;
  suffix_config.suffix_global_max_tokens = 48;
  auto ngram = make_proposer(ngram_config);
  auto suffix = make_proposer(suffix_config);
  std::vector<bool> live(8, false);
  Draft draft;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    const uint8_t op = bytes[i] >> 6, id = (bytes[i] >> 3) & 7, arg = bytes[i + 1];
    std::vector<int32_t> tokens;
    for (int j = 0; j <= (bytes[i] & 7); ++j) tokens.push_back((arg + j * 7) % 11);
    for (Proposer* p : {ngram.get(), suffix.get()}) {
      if (op == 0 && !live[id]) {
        p->start(id, tokens);
      } else if (op == 1 && live[id]) {
        p->append(id, tokens);
      } else if (op == 2 && live[id]) {
        const int32_t max_tokens = arg % 9;
        p->propose(id, max_tokens, draft);
        check(draft.size() <= max_tokens && draft.confidence.size() == draft.tokens.size());
        for (float c : draft.confidence) check(c > 0.0f && c <= 1.0f);
        for (int32_t t : draft.tokens) check(t >= 0 && t < 11);
      } else if (op == 3 && live[id]) {
        p->finish(id);
      }
    }
    if (op == 0) live[id] = true;
    if (op == 3) live[id] = false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    if (size > 0 && data[0] == '{') {
      SpeculativeConfig::parse(std::string_view(reinterpret_cast<const char*>(data), size));
    } else {
      run_script({data, size});
    }
  } catch (const Error&) {
  }
  return 0;
}
