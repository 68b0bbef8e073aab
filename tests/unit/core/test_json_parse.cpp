// The bounded JSON parser: nesting is refused while parsing (before anything
// can recurse on it), objects of many keys build in linear time, and
// duplicate keys follow the caller's policy.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/json_parse.h"

namespace deepinfer {
namespace {

std::string nested_arrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string object_of_keys(size_t n) {
  std::string s = "{";
  for (size_t i = 0; i < n; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  return s + "}";
}

TEST(JsonParse, RefusesNestingBeyondTheLimitWithoutRecursing) {
  JsonLimits limits;
  limits.max_depth = 64;
  EXPECT_NO_THROW(parse_json(nested_arrays(64), "doc", limits));
  // 100,000 levels: copying or dumping such a document would overflow the stack.
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  for (const std::string& text : {nested_arrays(65), nested_arrays(100000), objects}) {
    try {
      parse_json(text, "doc", limits);
      FAIL() << "accepted " << text.size() << " bytes of nesting";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("doc: JSON nested deeper than 64 levels"), std::string::npos) << e.what();
    }
  }
  // Objects inside arrays count the same.
  std::string mixed;
  for (int i = 0; i < 40; ++i) mixed += "[{\"a\":";
  mixed += "1";
  for (int i = 0; i < 40; ++i) mixed += "}]";
  EXPECT_THROW(parse_ordered_json(mixed, "doc", limits), Error);
}

TEST(JsonParse, BuildsTheSameDocumentAsNlohmann) {
  const std::string text =
      R"({"b":[1,-2,3.5,"x\u00e9",true,false,null,{"z":{}}],"a":{"y":[[],[[]]],"x":18446744073709551615}})";
  EXPECT_EQ(parse_json(text, "doc"), nlohmann::json::parse(text));
  const nlohmann::ordered_json ordered = parse_ordered_json(text, "doc");
  EXPECT_EQ(ordered, nlohmann::ordered_json::parse(text));
  EXPECT_EQ(ordered.begin().key(), "b");  // file order kept
  EXPECT_EQ(ordered.dump(), nlohmann::ordered_json::parse(text).dump());
}

TEST(JsonParse, ManyKeysKeepOrderAndLookUp) {
  // 100k keys: nlohmann's own ordered parse is quadratic here (tens of seconds).
  const nlohmann::ordered_json j = parse_ordered_json(object_of_keys(100000), "doc");
  ASSERT_EQ(j.size(), 100000u);
  size_t i = 0;
  for (const auto& [k, v] : j.items()) {
    ASSERT_EQ(k, "k" + std::to_string(i));
    ASSERT_EQ(v.get<size_t>(), i);
    ++i;
  }
  EXPECT_EQ(j.at("k99999").get<int>(), 99999);
}

TEST(JsonParse, DuplicateKeysFollowThePolicy) {
  const std::string text = R"({"a":1,"b":{"c":1,"c":[2]},"a":3})";
  try {
    parse_json(text, "header");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("header: key 'c' appears twice in one object"), std::string::npos);
  }
  EXPECT_THROW(parse_ordered_json(text, "header"), Error);
  JsonLimits last;
  last.duplicates = DuplicateKeys::LastWins;
  for (const auto& j : {parse_json(text, "r", last), nlohmann::json(parse_ordered_json(text, "r", last))}) {
    EXPECT_EQ(j["a"], 3);
    EXPECT_EQ(j["b"]["c"], nlohmann::json::array({2}));
    EXPECT_EQ(j.size(), 2u);
  }
  // The same key in different objects is not a duplicate.
  EXPECT_NO_THROW(parse_json(R"({"a":{"k":1},"b":{"k":2}})", "doc"));
  // A long duplicate key is shown cut short.
  const std::string key(10000, 'q');
  try {
    parse_json("{\"" + key + "\":1,\"" + key + "\":2}", "doc");
    FAIL();
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u);
  }
}

TEST(JsonParse, InvalidTextNamesTheDocument) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "nul", "\"\\ud800\"", "[1] x", "{\"a\":1}}"}) {
    try {
      parse_json(bad, "config.json");
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("config.json: invalid JSON", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace deepinfer
