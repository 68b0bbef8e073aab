#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "deepinfer/sampling_params.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
constexpr int32_t kVocab = 1000;

// Runs fn and returns the parameter named by the ParamError it throws ("" if none).
std::string error_param(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ParamError& e) {
    return e.param();
  }
  return "";
}

std::string invalid(const std::function<void(SamplingParams&)>& edit) {
  SamplingParams p;
  edit(p);
  return error_param([&] { p.validate(kVocab); });
}

TEST(SamplingParams, DefaultsAreVllmsAndValid) {
  SamplingParams p;
  EXPECT_EQ(p.n, 1);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_FLOAT_EQ(p.min_p, 0.0f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_TRUE(p.skip_special_tokens);
  EXPECT_FALSE(p.greedy());
  EXPECT_NO_THROW(p.validate(kVocab));
  p.temperature = 0.0f;
  EXPECT_TRUE(p.greedy());
}

TEST(SamplingParams, EachBoundIsEnforcedAndNamed) {
  EXPECT_EQ(invalid([](auto& p) { p.n = 0; }), "n");
  EXPECT_EQ(invalid([](auto& p) { p.n = SamplingParams::kMaxN + 1; }), "n");
  EXPECT_EQ(invalid([](auto& p) { p.n = SamplingParams::kMaxN; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.temperature = -0.1f; }), "temperature");
  EXPECT_EQ(invalid([](auto& p) { p.temperature = NAN; }), "temperature");
  EXPECT_EQ(invalid([](auto& p) { p.temperature = 0.0f; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.top_p = 0.0f; }), "top_p");
  EXPECT_EQ(invalid([](auto& p) { p.top_p = 1.01f; }), "top_p");
  EXPECT_EQ(invalid([](auto& p) { p.top_p = 0.01f; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.top_k = -2; }), "top_k");
  EXPECT_EQ(invalid([](auto& p) { p.top_k = -1; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.top_k = 1; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.min_p = -0.01f; }), "min_p");
  EXPECT_EQ(invalid([](auto& p) { p.min_p = 1.5f; }), "min_p");
  EXPECT_EQ(invalid([](auto& p) { p.min_p = 1.0f; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.presence_penalty = 2.5f; }), "presence_penalty");
  EXPECT_EQ(invalid([](auto& p) { p.presence_penalty = -2.0f; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.frequency_penalty = -2.1f; }), "frequency_penalty");
  EXPECT_EQ(invalid([](auto& p) { p.repetition_penalty = 0.0f; }), "repetition_penalty");
  EXPECT_EQ(invalid([](auto& p) { p.repetition_penalty = INFINITY; }), "repetition_penalty");
  EXPECT_EQ(invalid([](auto& p) { p.repetition_penalty = 0.5f; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.logit_bias[kVocab] = 1.0f; }), "logit_bias");
  EXPECT_EQ(invalid([](auto& p) { p.logit_bias[-1] = 1.0f; }), "logit_bias");
  EXPECT_EQ(invalid([](auto& p) { p.logit_bias[3] = 101.0f; }), "logit_bias");
  EXPECT_EQ(invalid([](auto& p) { p.logit_bias[kVocab - 1] = -100.0f; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.stop = {""}; }), "stop");
  EXPECT_EQ(invalid([](auto& p) { p.stop = {std::string(SamplingParams::kMaxStopStringBytes + 1, 'x')}; }), "stop");
  EXPECT_EQ(invalid([](auto& p) { p.stop.assign(SamplingParams::kMaxStopStrings + 1, "x"); }), "stop");
  EXPECT_EQ(invalid([](auto& p) { p.stop_token_ids = {5, kVocab}; }), "stop_token_ids");
  EXPECT_EQ(invalid([](auto& p) { p.max_tokens = 0; }), "max_tokens");
  EXPECT_EQ(invalid([](auto& p) { p.min_tokens = -1; }), "min_tokens");
  EXPECT_EQ(invalid([](auto& p) { p.min_tokens = 10, p.max_tokens = 5; }), "min_tokens");
  EXPECT_EQ(invalid([](auto& p) { p.min_tokens = 5, p.max_tokens = 5; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.logprobs = SamplingParams::kMaxLogprobs + 1; }), "logprobs");
  EXPECT_EQ(invalid([](auto& p) { p.logprobs = -1; }), "logprobs");
  EXPECT_EQ(invalid([](auto& p) { p.logprobs = 0; }), "");
  EXPECT_EQ(invalid([](auto& p) { p.prompt_logprobs = 21; }), "prompt_logprobs");
  EXPECT_EQ(error_param([] { SamplingParams().validate(0); }), "vocab_size");
}

TEST(SamplingParams, ErrorMessageNamesParameter) {
  SamplingParams p;
  p.top_p = 2.0f;
  try {
    p.validate(kVocab);
    FAIL() << "validate accepted top_p = 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
}

TEST(SamplingParams, FromJsonReadsEveryField) {
  const json j = json::parse(R"({
    "n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
    "logit_bias": {"5": 2.5, "17": -300}, "seed": 1234, "stop": ["\n\n", "END"],
    "stop_token_ids": [7, 8], "ignore_eos": true, "min_tokens": 3, "max_tokens": 64,
    "logprobs": 5, "prompt_logprobs": 1, "skip_special_tokens": false,
    "include_stop_str_in_output": true, "model": "x", "stream": false, "user": null})");
  std::vector<std::string> unknown;
  const SamplingParams p = SamplingParams::from_json(j, &unknown);
  EXPECT_EQ(p.n, 2);
  EXPECT_FLOAT_EQ(p.temperature, 0.7f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  ASSERT_EQ(p.logit_bias.size(), 2u);
  EXPECT_FLOAT_EQ(p.logit_bias.at(5), 2.5f);
  EXPECT_FLOAT_EQ(p.logit_bias.at(17), -100.0f);  // clamped like OpenAI / vLLM
  EXPECT_EQ(p.seed, 1234u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.min_tokens, 3);
  EXPECT_EQ(p.max_tokens, 64);
  EXPECT_EQ(p.logprobs, 5);
  EXPECT_EQ(p.prompt_logprobs, 1);
  EXPECT_FALSE(p.skip_special_tokens);
  EXPECT_TRUE(p.include_stop_str_in_output);
  std::sort(unknown.begin(), unknown.end());
  EXPECT_EQ(unknown, (std::vector<std::string>{"model", "stream"}));  // null fields are skipped
  EXPECT_NO_THROW(p.validate(kVocab));
}

TEST(SamplingParams, FromJsonAcceptsCommonClientForms) {
  auto p = SamplingParams::from_json(json::parse(R"({"stop": "###", "max_completion_tokens": 9.0,
                                                    "temperature": 1, "seed": -1, "top_p": null})"));
  EXPECT_EQ(p.stop, std::vector<std::string>{"###"});
  EXPECT_EQ(p.max_tokens, 9);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.seed, ~uint64_t{0});
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
  // Chat-style logprobs.
  EXPECT_EQ(SamplingParams::from_json(json::parse(R"({"logprobs": true, "top_logprobs": 3})")).logprobs, 3);
  EXPECT_EQ(SamplingParams::from_json(json::parse(R"({"logprobs": true})")).logprobs, 0);
  EXPECT_FALSE(SamplingParams::from_json(json::parse(R"({"logprobs": false})")).logprobs.has_value());
  EXPECT_EQ(error_param([] { SamplingParams::from_json(json::parse(R"({"top_logprobs": 3})")); }), "top_logprobs");
}

TEST(SamplingParams, FromJsonTypeErrorsNameTheField) {
  auto field_error = [](const char* text) {
    return error_param([&] { SamplingParams::from_json(json::parse(text)); });
  };
  EXPECT_EQ(field_error(R"({"n": "2"})"), "n");
  EXPECT_EQ(field_error(R"({"n": 2.5})"), "n");
  EXPECT_EQ(field_error(R"({"n": 1e12})"), "n");
  EXPECT_EQ(field_error(R"({"n": 4294967296})"), "n");
  EXPECT_EQ(field_error(R"({"temperature": "hot"})"), "temperature");
  EXPECT_EQ(field_error(R"({"top_p": true})"), "top_p");
  EXPECT_EQ(field_error(R"({"top_k": [1]})"), "top_k");
  EXPECT_EQ(field_error(R"({"min_p": {}})"), "min_p");
  EXPECT_EQ(field_error(R"({"presence_penalty": "0"})"), "presence_penalty");
  EXPECT_EQ(field_error(R"({"frequency_penalty": "0"})"), "frequency_penalty");
  EXPECT_EQ(field_error(R"({"repetition_penalty": "1"})"), "repetition_penalty");
  EXPECT_EQ(field_error(R"({"logit_bias": [1, 2]})"), "logit_bias");
  EXPECT_EQ(field_error(R"({"logit_bias": {"abc": 1}})"), "logit_bias");
  EXPECT_EQ(field_error(R"({"logit_bias": {"12x": 1}})"), "logit_bias");
  EXPECT_EQ(field_error(R"({"logit_bias": {"": 1}})"), "logit_bias");
  EXPECT_EQ(field_error(R"({"logit_bias": {"3": "big"}})"), "logit_bias");
  EXPECT_EQ(field_error(R"({"seed": "7"})"), "seed");
  EXPECT_EQ(field_error(R"({"seed": 1.5})"), "seed");
  EXPECT_EQ(field_error(R"({"stop": 5})"), "stop");
  EXPECT_EQ(field_error(R"({"stop": ["a", 1]})"), "stop");
  EXPECT_EQ(field_error(R"({"stop_token_ids": 5})"), "stop_token_ids");
  EXPECT_EQ(field_error(R"({"stop_token_ids": ["5"]})"), "stop_token_ids");
  EXPECT_EQ(field_error(R"({"ignore_eos": 1})"), "ignore_eos");
  EXPECT_EQ(field_error(R"({"min_tokens": "1"})"), "min_tokens");
  EXPECT_EQ(field_error(R"({"max_tokens": "16"})"), "max_tokens");
  EXPECT_EQ(field_error(R"({"logprobs": "5"})"), "logprobs");
  EXPECT_EQ(field_error(R"({"prompt_logprobs": 0.5})"), "prompt_logprobs");
  EXPECT_EQ(field_error(R"({"skip_special_tokens": "no"})"), "skip_special_tokens");
  EXPECT_EQ(field_error(R"({"include_stop_str_in_output": 0})"), "include_stop_str_in_output");
  EXPECT_EQ(field_error(R"([1, 2])"), "request");
}

}  // namespace
}  // namespace deepinfer
