// Tokenizer::from_json: the Hugging Face tokenizer.json front end.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_parts.h"

namespace deepinfer {

using json = nlohmann::json;
using namespace tok;

namespace {

int32_t checked_id(const json& v, std::string_view where) {
  DI_CHECK(v.is_number_integer(), "tokenizer: {}: id is not an integer", where);
  auto id = v.get<int64_t>();
  DI_CHECK(id >= 0 && id < (int64_t{1} << 24), "tokenizer: {}: id {} out of range", where, id);
  return static_cast<int32_t>(id);
}

void parse_model(const json& model, Tokenizer::Parts& parts) {
  DI_CHECK(model.is_object(), "tokenizer: 'model' is not an object");
  const std::string type = json_opt_string(model, "type", "BPE");
  DI_CHECK(type == "BPE", "tokenizer: model type '{}' is not supported (only BPE)", type);
  DI_CHECK(model.value("dropout", json()).is_null() || (model["dropout"].is_number() && model["dropout"].get<double>() == 0.0),
           "tokenizer: BPE dropout is not supported");

  const json& vocab = json_field(model, "vocab", "model");
  DI_CHECK(vocab.is_object(), "tokenizer: model.vocab is not an object");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) max_id = std::max<int64_t>(max_id, checked_id(id, "model.vocab"));
  DI_CHECK(max_id < static_cast<int64_t>(vocab.size()) * 2 + 1024, "tokenizer: vocabulary ids are too sparse");
  std::vector<std::string_view> tokens(static_cast<size_t>(max_id + 1));  // views of vocab's keys
  for (const auto& [token, id] : vocab.items()) {
    DI_CHECK(!token.empty(), "tokenizer: empty token in model.vocab");
    int32_t i = id.get<int32_t>();
    DI_CHECK(tokens[i].empty(), "tokenizer: id {} appears twice in model.vocab", i);
    tokens[i] = token;
  }
  parts.vocab = tok::Vocab(tokens);

  auto& opt = parts.options;
  opt.continuing_subword_prefix = json_opt_string(model, "continuing_subword_prefix", "");
  opt.end_of_word_suffix = json_opt_string(model, "end_of_word_suffix", "");
  opt.fuse_unk = json_bool(model, "fuse_unk", false);
  opt.byte_fallback = json_bool(model, "byte_fallback", false);
  opt.ignore_merges = json_bool(model, "ignore_merges", false);
  std::string unk = json_opt_string(model, "unk_token", "");
  if (!unk.empty()) {
    opt.unk_id = parts.vocab.find(unk);
    DI_CHECK(opt.unk_id.has_value(), "tokenizer: unk_token '{}' is not in the vocabulary", unk);
  }

  auto lookup = [&](std::string_view token, size_t rank) {
    auto id = parts.vocab.find(token);
    DI_CHECK(id.has_value(), "tokenizer: merge {} uses '{}', which is not in the vocabulary", rank, token);
    return *id;
  };
  const json& merges = model.contains("merges") ? model["merges"] : json::array();
  DI_CHECK(merges.is_array(), "tokenizer: model.merges is not an array");
  parts.merges.reserve(merges.size());
  std::string merged;
  const size_t prefix_len = opt.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string_view a, b;
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      DI_CHECK(space != std::string::npos, "tokenizer: merge {} ('{}') is not 'a b'", rank, s);
      a = std::string_view(s).substr(0, space);
      b = std::string_view(s).substr(space + 1);
    } else {
      DI_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               "tokenizer: merge {} is neither 'a b' nor a pair of strings", rank);
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    }
    merged.assign(a);
    // The right part loses its continuation prefix when joined.
    if (prefix_len && b.substr(0, prefix_len) == opt.continuing_subword_prefix) merged += b.substr(prefix_len);
    else merged += b;
    parts.merges.push_back({lookup(a, rank), lookup(b, rank), lookup(merged, rank)});
  }
}

void parse_added_tokens(const json& added, Tokenizer::Parts& parts) {
  if (added.is_null()) return;
  DI_CHECK(added.is_array(), "tokenizer: added_tokens is not an array");
  for (const auto& a : added) {
    tok::AddedToken t;
    t.id = checked_id(json_field(a, "id", "added token"), "added token");
    t.content = json_string(a, "content", "added token");
    DI_CHECK(!t.content.empty(), "tokenizer: added token {} is empty", t.id);
    t.special = json_bool(a, "special", false);
    t.lstrip = json_bool(a, "lstrip", false);
    t.rstrip = json_bool(a, "rstrip", false);
    t.normalized = json_bool(a, "normalized", !t.special);
    t.single_word = json_bool(a, "single_word", false);
    parts.added.push_back(std::move(t));
  }
}

// Resolves a special-token name of a post-processor to its ids.
std::vector<int32_t> special_ids(const json& special_tokens, const std::string& name) {
  const json& entry = json_field(special_tokens, name.c_str(), "TemplateProcessing special_tokens");
  std::vector<int32_t> ids;
  for (const auto& id : json_array(entry, "ids", "TemplateProcessing special token"))
    ids.push_back(checked_id(id, "TemplateProcessing"));
  return ids;
}

// The post-processor's template for single sequences, as ids before and after the text.
void parse_post_processor(const json& pp, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (pp.is_null()) return;
  const std::string type = json_string(pp, "type", "post_processor");
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    for (const auto& child : json_array(pp, "processors", "Sequence post-processor"))
      parse_post_processor(child, prefix, suffix);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& special = json_field(pp, "special_tokens", "TemplateProcessing");
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (const auto& item : json_array(pp, "single", "TemplateProcessing")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        auto ids = special_ids(special, json_string(item["SpecialToken"], "id", "TemplateProcessing SpecialToken"));
        auto& dst = seen_sequence ? after : before;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else {
        fail("tokenizer: TemplateProcessing item is neither Sequence nor SpecialToken");
      }
    }
    prefix.insert(prefix.begin(), before.begin(), before.end());
    suffix.insert(suffix.end(), after.begin(), after.end());
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json& cls = json_array(pp, "cls", type);
    const json& sep = json_array(pp, "sep", type);
    DI_CHECK(cls.size() == 2 && sep.size() == 2, "tokenizer: {} cls/sep must be [token, id]", type);
    prefix.insert(prefix.begin(), checked_id(cls[1], type));
    suffix.push_back(checked_id(sep[1], type));
    return;
  }
  fail("tokenizer: unsupported post-processor type '{}'", type);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, const json* config) {
  json root = parse_json(tokenizer_json, "tokenizer: tokenizer.json", tokenizer_json_limits());
  DI_CHECK(root.is_object(), "tokenizer: tokenizer.json is not a JSON object");
  Parts parts;
  parse_model(json_field(root, "model", "tokenizer.json"), parts);
  parse_added_tokens(root.value("added_tokens", json()), parts);
  parts.normalizer = tok::make_normalizer(root.value("normalizer", json()));
  parts.pre_tokenizer = tok::make_pre_tokenizer(root.value("pre_tokenizer", json()));
  parts.decoder = tok::make_decoder(root.value("decoder", json()));
  parse_post_processor(root.value("post_processor", json()), parts.prefix, parts.suffix);

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->assemble(std::move(parts));
  if (config) t->apply_config(*config);
  t->finish_special_ids();
  return t;
}

}  // namespace deepinfer
