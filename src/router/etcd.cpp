#include "router/etcd.h"

#include <nlohmann/json.hpp>

#include <array>
#include <charconv>

#include "core/logging.h"

namespace deepinfer::router {

namespace {

using json = nlohmann::json;

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(in[i])} << 16) | (uint32_t{static_cast<uint8_t>(in[i + 1])} << 8) |
                       static_cast<uint8_t>(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(in[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(in[i + 1])} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Nothing on characters outside the alphabet or a bad length.
std::optional<std::string> unbase64(std::string_view in) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        ++pad;
        v <<= 6;
        continue;
      }
      if (pad > 0) return std::nullopt;
      const int8_t d = table[static_cast<uint8_t>(c)];
      if (d < 0) return std::nullopt;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out += static_cast<char>((v >> 16) & 255);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

// etcd's gateway writes 64-bit integers as strings.
std::optional<int64_t> int64_field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return std::nullopt;
  const std::string s = it->get<std::string>();
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The key just past every key that starts with `prefix` (etcd's range end).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(static_cast<uint8_t>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace

std::optional<std::string> EtcdClient::call(const std::string& path, const std::string& body) {
  const auto answer = simple_request(endpoint_, "POST", path, body, {{"Content-Type", "application/json"}}, timeout_);
  if (!answer || answer->status != 200) return std::nullopt;
  return answer->body;
}

std::optional<int64_t> EtcdClient::grant_lease(int64_t ttl_s) {
  const auto body = call("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}.dump());
  if (!body) return std::nullopt;
  const json j = json::parse(*body, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return int64_field(j, "ID");
}

bool EtcdClient::keep_alive(int64_t lease) {
  const auto body = call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump());
  if (!body) return false;
  // A lease that is gone comes back without a TTL (or with TTL 0).
  const json j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.contains("result") || !j["result"].is_object()) return false;
  const auto ttl = int64_field(j["result"], "TTL");
  return ttl && *ttl > 0;
}

bool EtcdClient::revoke(int64_t lease) {
  return call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump()).has_value();
}

bool EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  json req = {{"key", base64(key)}, {"value", base64(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  return call("/v3/kv/put", req.dump()).has_value();
}

std::optional<std::vector<std::pair<std::string, std::string>>> EtcdClient::list(const std::string& prefix) {
  const auto body = call("/v3/kv/range", json{{"key", base64(prefix)}, {"range_end", base64(prefix_end(prefix))}}.dump());
  if (!body) return std::nullopt;
  const json j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> out;
  auto kvs = j.find("kvs");
  if (kvs == j.end()) return out;  // no keys
  if (!kvs->is_array()) return std::nullopt;
  for (const json& kv : *kvs) {
    if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string()) continue;
    const auto key = unbase64(kv["key"].get<std::string>());
    const auto value = kv.contains("value") && kv["value"].is_string() ? unbase64(kv["value"].get<std::string>())
                                                                       : std::optional<std::string>("");
    if (key && value) out.emplace_back(*key, *value);
  }
  return out;
}

EtcdRegistration::EtcdRegistration(Url endpoint, std::string backend_url, std::string value, int64_t ttl_s)
    : client_(std::move(endpoint), std::chrono::milliseconds(2000)),
      key_(kEtcdBackendPrefix + backend_url),
      value_(std::move(value)),
      ttl_s_(ttl_s) {
  if (!register_now()) log_warn("etcd: could not register {} yet; retrying", key_);
  thread_ = std::thread([this] { loop(); });
}

EtcdRegistration::~EtcdRegistration() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (lease_ != 0 && client_.revoke(lease_)) log_info("etcd: {} unregistered", key_);
}

bool EtcdRegistration::register_now() {
  const auto lease = client_.grant_lease(ttl_s_);
  if (!lease || !client_.put(key_, value_, *lease)) return false;
  lease_ = *lease;
  log_info("etcd: registered {} (lease of {} s)", key_, ttl_s_);
  return true;
}

void EtcdRegistration::loop() {
  // Renewed three times per lease: one lost renewal never drops the backend.
  const auto period = std::chrono::milliseconds(ttl_s_ * 1000 / 3);
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (wake_.wait_for(lock, period, [&] { return stop_; })) return;
    }
    if (lease_ != 0 && client_.keep_alive(lease_)) continue;
    if (lease_ != 0) log_warn("etcd: the lease of {} was lost; registering again", key_);
    lease_ = 0;
    register_now();
  }
}

std::optional<std::vector<std::string>> list_etcd_backends(EtcdClient& client) {
  const auto kvs = client.list(kEtcdBackendPrefix);
  if (!kvs) return std::nullopt;
  std::vector<std::string> urls;
  constexpr size_t kMaxBackends = 1024;
  for (const auto& [key, value] : *kvs) {
    if (urls.size() >= kMaxBackends) break;
    const json j = json::parse(value, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("url") || !j["url"].is_string()) {
      log_debug("etcd: {} does not hold a backend record; skipped", key.substr(0, 200));
      continue;
    }
    urls.push_back(j["url"].get<std::string>());
  }
  return urls;
}

}  // namespace deepinfer::router
