#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace deepinfer::tok {

namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

// One match-data block per thread is enough: only the whole-match offsets are read.
struct MatchData {
  pcre2_match_data* data = nullptr;
  ~MatchData() {
    if (data) pcre2_match_data_free(data);
  }
};

pcre2_match_data* thread_match_data() {
  thread_local MatchData md;
  if (!md.data) md.data = pcre2_match_data_create(4, nullptr);
  return md.data;
}

// A JIT stack larger than PCRE2's 32 KiB default so long whitespace or letter runs
// in hostile input cannot exhaust it.
struct JitContext {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  JitContext() {
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (stack && context) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~JitContext() {
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

pcre2_match_context* thread_match_context() {
  thread_local JitContext jc;
  return jc.context;
}

}  // namespace

Regex::Regex(std::string_view pattern, bool literal) : pattern_(pattern), literal_(literal) {
  if (literal_) {
    DI_CHECK(!pattern_.empty(), "tokenizer: empty literal split pattern");
    return;
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof(msg));
    fail("tokenizer: bad regex '{}' at offset {}: {}", pattern_, offset,
         reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  code_ = code;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(as_code(code_));
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  if (literal_) {
    size_t pos = 0;
    while ((pos = text.find(pattern_, pos)) != std::string_view::npos) {
      out.emplace_back(pos, pos + pattern_.size());
      pos += pattern_.size();
    }
    return;
  }
  pcre2_match_data* md = thread_match_data();
  pcre2_match_context* mc = thread_match_context();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(as_code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    DI_CHECK(rc >= 0, "tokenizer: regex match failed ({}) for '{}'", rc, pattern_);
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step over one character so the scan always advances.
      start = e + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::vector<std::pair<size_t, size_t>> matches;
  find_all(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (auto [b, e] : matches) {
    out.append(text.substr(prev, b - prev));
    out.append(replacement);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace deepinfer::tok
