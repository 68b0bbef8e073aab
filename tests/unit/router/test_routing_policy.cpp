#include <gtest/gtest.h>

#include <map>

#include "router/http_client.h"
#include "router/request_plan.h"
#include "router/routing_policy.h"
#include "server/api_error.h"

namespace deepinfer::router {
namespace {

std::string conversation(int turns, const std::string& system) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", system}});
  for (int t = 0; t < turns; ++t) {
    messages.push_back({{"role", "user"}, {"content", "question number " + std::to_string(t) + " about the system"}});
    messages.push_back({{"role", "assistant"}, {"content", "answer number " + std::to_string(t) + ", at some length"}});
  }
  return nlohmann::ordered_json{{"model", "m"}, {"messages", messages}}.dump();
}

TEST(PrefixChunks, ChainedSoEqualPrefixesGiveEqualLeadingHashes) {
  const std::string a(300, 'a');
  const auto ha = prefix_chunk_hashes(a, 64);
  const auto hb = prefix_chunk_hashes(a + "b" + std::string(200, 'c'), 64);
  ASSERT_EQ(ha.size(), 4u);  // full chunks only
  ASSERT_EQ(hb.size(), 7u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ha[i], hb[i]);
  // A chunk equal in bytes but after a different prefix hashes differently.
  const auto hc = prefix_chunk_hashes(std::string(64, 'x') + std::string(64, 'a'), 64);
  EXPECT_NE(hc[1], ha[1]);
}

TEST(PrefixAffinity, MatchStopsAtTheFirstUnseenChunkAndEvictsLeastRecent) {
  PrefixAffinity aff(6);
  const auto long_text = prefix_chunk_hashes(std::string(64 * 5, 'q'), 64);
  aff.insert(0, long_text);
  EXPECT_EQ(aff.match(0, long_text), 5u);
  EXPECT_EQ(aff.match(1, long_text), 0u);
  auto other = prefix_chunk_hashes(std::string(64 * 3, 'z'), 64);
  aff.insert(0, other);  // 8 chunks > capacity 6: the two least recent go (the first text's tail)
  EXPECT_EQ(aff.match(0, other), 3u);
  EXPECT_EQ(aff.match(0, long_text), 3u);
  aff.clear(0);
  EXPECT_EQ(aff.match(0, other), 0u);
}

// The chunks of a conversation's routing text; conversations differ from their first byte on.
std::vector<uint64_t> conversation_chunks(int conv, int turns) {
  const std::string body = conversation(turns, std::to_string(conv) + ": system prompt" + std::string(100, '.'));
  return prefix_chunk_hashes(read_routed_request("/v1/chat/completions", body).routing_text, 64);
}

TEST(Router, CacheAwareKeepsAConversationOnOneBackendAndSpreadsNewOnes) {
  Router r(RoutingPolicy::CacheAware, 4, 1 << 16);
  std::vector<Candidate> c = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
  std::map<size_t, int> first_turn_on;
  std::map<int, size_t> home;
  for (int conv = 0; conv < 8; ++conv) {
    const auto chunks = conversation_chunks(conv, 1);
    const RoutingChoice choice = r.choose(c, chunks);
    EXPECT_EQ(choice.matched_chunks, 0u);
    home[conv] = choice.backend;
    ++first_turn_on[choice.backend];
  }
  // New conversations on an idle pool take turns.
  for (const auto& [backend, n] : first_turn_on) EXPECT_EQ(n, 2) << backend;
  for (int turn = 2; turn <= 4; ++turn) {
    for (int conv = 0; conv < 8; ++conv) {
      const auto chunks = conversation_chunks(conv, turn);
      const RoutingChoice choice = r.choose(c, chunks);
      EXPECT_EQ(choice.backend, home[conv]) << "conversation " << conv << " turn " << turn;
      EXPECT_GT(choice.matched_chunks, 2u);
    }
  }
}

TEST(Router, CacheAwareGivesUpAffinityBeyondTheLoadBudget) {
  Router r(RoutingPolicy::CacheAware, 4, 1 << 16);
  const auto chunks = prefix_chunk_hashes(conversation(3, std::string(500, 's')), 64);
  EXPECT_EQ(r.choose({{0, 0}, {1, 0}}, chunks).backend == r.choose({{0, 0}, {1, 0}}, chunks).backend, true);
  const size_t home = r.choose({{0, 0}, {1, 0}}, chunks).backend;
  const size_t away = 1 - home;
  std::vector<Candidate> loaded(2);
  loaded[home] = {home, 4};
  loaded[away] = {away, 0};
  EXPECT_EQ(r.choose(loaded, chunks).backend, home);  // within the budget: affinity
  loaded[home].load = 5;
  EXPECT_EQ(r.choose(loaded, chunks).backend, away);  // beyond it: the least loaded
}

TEST(Router, LeastLoadAndRoundRobin) {
  Router ll(RoutingPolicy::LeastLoad, 0, 16);
  EXPECT_EQ(ll.choose({{0, 3}, {1, 1}, {2, 2}}, {}).backend, 1u);
  Router rr(RoutingPolicy::RoundRobin, 0, 16);
  std::vector<size_t> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(rr.choose({{5, 9}, {7, 0}, {9, 3}}, {}).backend);
  EXPECT_EQ(seen, (std::vector<size_t>{5, 7, 9, 5, 7, 9}));
  EXPECT_THROW(parse_routing_policy("random"), Error);
}

TEST(RequestPlan, ReadsModelStreamAndTheTextThatMakesThePrompt) {
  const RoutedRequest chat = read_routed_request("/v1/chat/completions", conversation(1, "sys"));
  EXPECT_EQ(chat.api, server::Api::Chat);
  EXPECT_EQ(chat.model, "m");
  EXPECT_FALSE(chat.stream);
  EXPECT_NE(chat.routing_text.find("question number 0"), std::string::npos);
  // A later turn's text starts with the earlier turn's text but for its closing bracket.
  const RoutedRequest later = read_routed_request("/v1/chat/completions", conversation(2, "sys"));
  const std::string shared = chat.routing_text.substr(0, chat.routing_text.size() - 3);
  EXPECT_EQ(later.routing_text.rfind(shared, 0), 0u);

  const RoutedRequest msg =
      read_routed_request("/v1/messages", R"({"model": "m", "system": "be brief", "stream": true, "max_tokens": 9,
                                              "messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(msg.api, server::Api::Messages);
  EXPECT_TRUE(msg.stream);
  EXPECT_EQ(msg.routing_text.rfind("be brief\n", 0), 0u);
  const auto prefill = nlohmann::json::parse(prefill_body(msg));
  EXPECT_FALSE(prefill["stream"].get<bool>());
  EXPECT_EQ(prefill["max_tokens"], 9);  // the prefill engine stops after one token itself

  const RoutedRequest comp = read_routed_request("/v1/completions", R"({"prompt": "abc", "stream_options": {}})");
  EXPECT_EQ(comp.api, server::Api::Completion);
  EXPECT_EQ(comp.routing_text, "abc\n");
  EXPECT_FALSE(nlohmann::json::parse(prefill_body(comp)).contains("stream_options"));

  EXPECT_THROW(read_routed_request("/v1/completions", "[1, 2]"), server::ApiError);
  EXPECT_THROW(read_routed_request("/v1/completions", "{\"prompt\": "), server::ApiError);
  EXPECT_THROW(read_routed_request("/v1/completions", std::string(100, '[') + std::string(100, ']')), server::ApiError);
}

TEST(Url, ParsesHostPortAndBaseAndRejectsTheRest) {
  const Url u = parse_url("http://10.0.0.7:8001/api/");
  EXPECT_EQ(u.host, "10.0.0.7");
  EXPECT_EQ(u.port, 8001);
  EXPECT_EQ(u.base_path, "/api");
  EXPECT_EQ(u.str(), "http://10.0.0.7:8001/api");
  EXPECT_EQ(parse_url("http://localhost").port, 80);
  for (const char* bad : {"https://x:1", "x:1", "http://:80", "http://h:0", "http://h:99999", "http://h:8a",
                          "http://user@h:1"}) {
    EXPECT_THROW(parse_url(bad), Error) << bad;
  }
}

TEST(HttpCall, AnUnreachableBackendIsReportedAsNotStarted) {
  // Port 1 on the loopback: nothing listens there.
  HttpCall call(parse_url("http://127.0.0.1:1"), HttpCall::Timeouts{});
  try {
    call.start("POST", "/v1/completions", "{}", {});
    FAIL() << "connected to port 1";
  } catch (const CallError& e) {
    EXPECT_EQ(e.kind(), CallFailure::Unreachable);
  }
  EXPECT_FALSE(simple_request(parse_url("http://127.0.0.1:1"), "GET", "/health", "", {}, std::chrono::milliseconds(500)));
}

}  // namespace
}  // namespace deepinfer::router
