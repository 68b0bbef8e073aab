// Component behaviour on small hand-written tokenizer.json files: normalizers,
// pre-tokenizer split behaviours, decoders, byte fallback, added-token flags,
// malformed input and invalid UTF-8.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::test {
namespace {

using json = nlohmann::json;

// A toy byte-fallback model over a handful of characters.
json toy(json normalizer, json pre_tokenizer, json decoder) {
  json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"c", 4}, {"abc", 5}, {"\u2581", 6}, {"\u2581a", 7}, {"1", 8}, {"2", 9}};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    vocab[buf] = 10 + b;
  }
  return {{"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", json::array({"a b", json::array({"ab", "c"}), "\u2581 a"})},
            {"unk_token", "<unk>"},
            {"byte_fallback", true}}},
          {"added_tokens",
           json::array({json{{"id", 300}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                        json{{"id", 301}, {"content", "[X]"}, {"special", false}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}}})},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", decoder},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}}}};
}

std::unique_ptr<Tokenizer> load(const json& j) { return Tokenizer::from_json(j.dump()); }

const json kSpmNormalizer = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
const json kSpmDecoder = {{"type", "Sequence"},
                          {"decoders", json::array({json{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                                    json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}}})}};

TEST(Bpe, MergesByRankAndFallsBackToBytes) {
  auto tok = load(toy(kSpmNormalizer, nullptr, kSpmDecoder));
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{5}));
  EXPECT_EQ(tok->encode("abc", true), (std::vector<int32_t>{300, 5}));
  EXPECT_EQ(tok->encode(" a", false), (std::vector<int32_t>{7}));
  // "é" is not in the vocabulary: its two UTF-8 bytes become <0xC3> <0xA9>.
  EXPECT_EQ(tok->encode("é", false), (std::vector<int32_t>{10 + 0xC3, 10 + 0xA9}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{10 + 0xC3, 10 + 0xA9, 5}, false), "éabc");
  // A lone continuation byte decodes to U+FFFD, as tokenizers does.
  EXPECT_EQ(tok->decode(std::vector<int32_t>{10 + 0xA9}, false), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{300, 5, 99999, -1}, true), "abc");
}

TEST(AddedTokens, SpecialMatchedAndStripFlagsAbsorbWhitespace) {
  auto tok = load(toy(kSpmNormalizer, nullptr, kSpmDecoder));
  EXPECT_EQ(tok->encode("<s>ab", false), (std::vector<int32_t>{300, 3}));
  EXPECT_EQ(tok->encode("a  [X]  b", false), (std::vector<int32_t>{1, 301, 2}));
  EXPECT_TRUE(tok->is_special(300));
  EXPECT_FALSE(tok->is_special(301));
  EXPECT_EQ(tok->token_to_id("[X]"), 301);
  EXPECT_EQ(tok->id_to_token(3), "ab");
  EXPECT_EQ(tok->id_to_token(1 << 20), "");
  EXPECT_EQ(tok->bos_id(), 300);
}

TEST(Normalizers, SequenceOfUnicodeFormsAndEdits) {
  json seq = {{"type", "Sequence"},
              {"normalizers", json::array({json{{"type", "NFKC"}}, json{{"type", "Lowercase"}}, json{{"type", "Strip"}},
                                           json{{"type", "Prepend"}, {"prepend", "\u2581"}}, kSpmNormalizer})}};
  auto tok = load(toy(seq, nullptr, kSpmDecoder));
  // NFKC folds the full-width letter, Lowercase gives "ab c", Strip drops the outer spaces,
  // Prepend and Replace give "▁ab▁c"; "a b" outranks "▁ a".
  EXPECT_EQ(tok->encode("  ＡB c ", false), (std::vector<int32_t>{6, 3, 6, 4}));
}

TEST(PreTokenizers, SplitBehaviours) {
  auto ids_for = [](const std::string& behavior, bool invert) {
    json pre = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}+"}}}, {"behavior", behavior}, {"invert", invert}};
    return load(toy(nullptr, pre, kSpmDecoder))->encode("ab12c", false);
  };
  // "ab" | "12" | "c": the digits are in vocab only as single characters.
  EXPECT_EQ(ids_for("Isolated", false), (std::vector<int32_t>{3, 8, 9, 4}));
  EXPECT_EQ(ids_for("Removed", false), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(ids_for("MergedWithPrevious", false), (std::vector<int32_t>{3, 8, 9, 4}));
  // "ab" | "12c": "abc" can no longer form.
  EXPECT_EQ(ids_for("MergedWithNext", false), (std::vector<int32_t>{3, 8, 9, 4}));
  EXPECT_EQ(ids_for("Removed", true), (std::vector<int32_t>{8, 9}));
  json merged_prev = {{"type", "Split"}, {"pattern", {{"String", "c"}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
  EXPECT_EQ(load(toy(nullptr, merged_prev, kSpmDecoder))->encode("abcab", false), (std::vector<int32_t>{5, 3}));
  json merged_next = {{"type", "Split"}, {"pattern", {{"String", "c"}}}, {"behavior", "MergedWithNext"}, {"invert", false}};
  EXPECT_EQ(load(toy(nullptr, merged_next, kSpmDecoder))->encode("abcab", false), (std::vector<int32_t>{3, 4, 3}));
}

TEST(PreTokenizers, MetaspaceAndDecoderStripFirstSpace) {
  json pre = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
  json dec = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}};
  auto tok = load(toy(nullptr, pre, dec));
  auto ids = tok->encode("a a", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(tok->decode(ids, false), "a a");
  // Streaming keeps the first-token rule: no leading space, same text as decode.
  StreamingDetokenizer stream(*tok, false);
  std::string out;
  for (int32_t id : ids) out += stream.push(id);
  out += stream.finish();
  EXPECT_EQ(out, "a a");
}

TEST(Streaming, NeverSplitsACharacterAcrossByteTokens) {
  auto tok = load(toy(kSpmNormalizer, nullptr, kSpmDecoder));
  auto ids = tok->encode("a€b", false);  // € = E2 82 AC, three byte-fallback tokens
  ASSERT_EQ(ids.size(), 5u);
  StreamingDetokenizer stream(*tok, false);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(stream.push(id));
  chunks.push_back(stream.finish());
  std::string all;
  for (const auto& c : chunks) {
    EXPECT_TRUE(tok::utf8_is_valid(c));
    all += c;
  }
  EXPECT_EQ(all, "a€b");
  EXPECT_EQ(chunks[1], "");  // <0xE2> alone is held back
  // An invalid run turns every byte of it into U+FFFD, even an ASCII byte before it
  // ("X" = <0x58>), so nothing of a run is emitted before it ends.
  std::vector<int32_t> run = {10 + 'X', 10 + 0xC8, 10 + 0x20, 1};
  StreamingDetokenizer run_stream(*tok, false);
  std::string run_text;
  for (int32_t id : run) run_text += run_stream.push(id);
  run_text += run_stream.finish();
  EXPECT_EQ(run_text, tok->decode(run, false));
  EXPECT_EQ(run_text, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "a");
  // A stream that ends mid-character flushes U+FFFD, as the full decode does.
  StreamingDetokenizer cut(*tok, false);
  std::string partial = cut.push(ids[0]);
  partial += cut.push(ids[1]);
  partial += cut.finish();
  EXPECT_EQ(partial, tok->decode(std::vector<int32_t>{ids[0], ids[1]}, false));
}

TEST(Encode, InvalidUtf8IsReplacedNotFatal) {
  const Tokenizer& tok = family_tokenizer("qwen3");
  std::string bad = "ok\xC3(\xFF\xE2\x82";
  auto ids = tok.encode(bad, false);
  EXPECT_EQ(ids, tok.encode(tok::utf8_sanitize(bad), false));
  EXPECT_EQ(tok.decode(ids, false), "ok\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8, SanitizeUsesMaximalSubparts) {
  EXPECT_EQ(tok::utf8_sanitize("a\xE2\x82"), "a\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_sanitize("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(tok::utf8_incomplete_tail("ab\xE2\x82"), 2u);
  EXPECT_EQ(tok::utf8_incomplete_tail("ab\xE2\x82\xAC"), 0u);
}

TEST(Load, MalformedInputGivesClearErrors) {
  EXPECT_THROW(Tokenizer::from_json("{not json"), Error);
  EXPECT_THROW(Tokenizer::from_json("[]"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 99999999}, "merges": []}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})"),
               Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
}

TEST(Families, StopTokensFromTokenizerJsonAlone) {
  const Tokenizer& qwen = family_tokenizer("qwen3");
  auto im_end = qwen.token_to_id("<|im_end|>");
  ASSERT_TRUE(im_end);
  const auto& eos = qwen.eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), *im_end), eos.end());
  const Tokenizer& gemma = family_tokenizer("gemma3");
  EXPECT_EQ(gemma.bos_id(), 2);
  auto eot = gemma.token_to_id("<end_of_turn>");
  ASSERT_TRUE(eot);
  EXPECT_NE(std::find(gemma.eos_ids().begin(), gemma.eos_ids().end(), *eot), gemma.eos_ids().end());
}

}  // namespace
}  // namespace deepinfer::test
