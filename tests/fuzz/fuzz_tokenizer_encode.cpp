// Fuzzes encoding and decoding with real tokenizers, loaded once: Qwen3's
// byte-level BPE (from ../shared/tokenizers, relative to the repository root or
// $DEEPINFER_SOURCE_DIR) and a small SentencePiece-style byte-fallback model.
// The first input byte picks the tokenizer and flags; the rest is the text, and
// is also read as token ids for decoding. Checks: no crash, decode never fails,
// and streamed detokenization concatenates to the full decode.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/error.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string read_xz(const std::string& path) {
  std::string cmd = "xz -dc '" + path + "' 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {};
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  pclose(pipe);
  return out;
}

std::unique_ptr<deepinfer::Tokenizer> load_qwen() {
  const char* root = std::getenv("DEEPINFER_SOURCE_DIR");
  std::string base = root ? root : ".";
  std::string json = read_xz(base + "/../shared/tokenizers/qwen3/tokenizer.json.xz");
  if (json.empty()) {
    std::fprintf(stderr, "fuzz_tokenizer_encode: cannot read ../shared/tokenizers/qwen3/tokenizer.json.xz\n");
    std::abort();
  }
  return deepinfer::Tokenizer::from_json(json);
}

std::unique_ptr<deepinfer::Tokenizer> load_spm() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3, "a": 4, "b": 5, "\u2581a": 6, "ab": 7)";
  for (int b = 0; b < 256; ++b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), ", \"<0x%02X>\": %d", b, 8 + b);
    vocab += buf;
  }
  std::string json = R"({"model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
    "vocab": {)" + vocab + R"(}, "merges": [["\u2581", "a"], ["a", "b"]]},
    "added_tokens": [{"id": 1, "content": "<s>", "special": true, "normalized": false},
                     {"id": 2, "content": "</s>", "special": true, "normalized": false, "lstrip": true, "rstrip": true}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                   {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}})";
  return deepinfer::Tokenizer::from_json(json);
}

struct Tokenizers {
  std::unique_ptr<deepinfer::Tokenizer> qwen = load_qwen();
  std::unique_ptr<deepinfer::Tokenizer> spm = load_spm();
};

const Tokenizers& tokenizers() {
  static const Tokenizers t;
  return t;
}

}  // namespace

// Loading Qwen3's 11 MB tokenizer.json under ASan takes seconds: do it before
// libFuzzer starts timing inputs (replay builds load lazily on the first input).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& qwen = tokenizers().qwen;
  const auto& spm = tokenizers().spm;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const deepinfer::Tokenizer& tok = (mode & 1) ? *spm : *qwen;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  auto ids = tok.encode(text, (mode & 2) != 0);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  // Arbitrary ids (including invalid ones) must decode without failing.
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  for (auto& id : raw) id = (mode & 4) ? id : static_cast<int32_t>(static_cast<uint32_t>(id) % (tok.vocab_size() + 8));
  for (const auto* seq : {&ids, &raw}) {
    const bool skip = (mode & 8) != 0;
    std::string full = tok.decode(*seq, skip);
    deepinfer::StreamingDetokenizer stream(tok, skip);
    std::string streamed;
    for (int32_t id : *seq) streamed += stream.push(id);
    streamed += stream.finish();
    if (streamed != full) {
      std::fprintf(stderr, "streamed detokenization differs from decode\n");
      std::abort();
    }
  }
  return 0;
}
