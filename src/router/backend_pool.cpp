#include "router/backend_pool.h"

#include <nlohmann/json.hpp>

#include "core/logging.h"

namespace deepinfer::router {

BackendPool::BackendPool(std::vector<Url> urls, Options options) : options_(std::move(options)) {
  for (Url& u : urls) {
    auto slot = std::make_unique<Slot>();
    slot->url = std::move(u);
    slots_.push_back(std::move(slot));
  }
}

BackendPool::~BackendPool() { stop(); }

void BackendPool::start() {
  for (size_t i = 0; i < slots_.size(); ++i) check(i);
  thread_ = std::thread([this] { loop(); });
}

void BackendPool::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackendPool::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (wake_.wait_for(lock, options_.interval, [&] { return stop_; })) return;
    }
    for (size_t i = 0; i < slots_.size(); ++i) check(i);
  }
}

void BackendPool::check(size_t i) {
  Slot& s = *slots_[i];
  Headers headers;
  if (!options_.api_key.empty()) headers.emplace_back("Authorization", "Bearer " + options_.api_key);
  const auto answer = simple_request(s.url, "GET", "/server_info", "", headers, options_.timeout);
  bool ok = false;
  server::ServeRole role = server::ServeRole::Both;
  std::string model;
  int64_t max_len = 0;
  std::string why = "no answer";
  if (answer && answer->status == 200) {
    try {
      const auto info = nlohmann::json::parse(answer->body);
      role = server::parse_serve_role(info.value("role", "both")).value_or(server::ServeRole::Both);
      model = info.value("model", "");
      max_len = info.value("max_model_len", int64_t{0});
      ok = info.value("ready", false);
      why = ok ? "" : "not ready";
    } catch (const std::exception& e) {
      why = std::string("bad /server_info: ") + e.what();
    }
  } else if (answer) {
    why = "/server_info answered " + std::to_string(answer->status);
  }
  bool recovered = false;
  {
    std::lock_guard lock(mutex_);
    if (ok) {
      if (!s.known || s.role != role || s.model != model) {
        log_info("router: backend {} is {} for model '{}' (max-model-len {})", s.url.str(), server::serve_role_name(role),
                 model, max_len);
      }
      recovered = s.was_down;
      s.known = true;
      s.role = role;
      s.model = model;
      s.max_model_len = max_len;
      s.was_down = false;
    } else if (s.healthy || !s.known) {
      if (s.healthy) log_warn("router: backend {} is down ({})", s.url.str(), why);
      s.was_down = s.known;
    }
    s.healthy = ok;
  }
  if (recovered) {
    log_info("router: backend {} is back", s.url.str());
    if (on_recovered_) on_recovered_(i);
  }
}

std::vector<BackendState> BackendPool::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<BackendState> out;
  out.reserve(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = *slots_[i];
    out.push_back({i, s.url, s.role, s.model, s.max_model_len, s.known, s.healthy, s.draining, s.load.load()});
  }
  return out;
}

std::optional<size_t> BackendPool::find(const std::string& url) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i]->url.str() == url) return i;
  }
  try {
    const std::string normal = parse_url(url).str();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i]->url.str() == normal) return i;
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

void BackendPool::report_failure(size_t i) {
  std::lock_guard lock(mutex_);
  Slot& s = *slots_[i];
  if (s.healthy) log_warn("router: backend {} failed a call; out until it answers again", s.url.str());
  s.healthy = false;
  s.was_down = true;
}

void BackendPool::set_draining(size_t i, bool draining) {
  std::lock_guard lock(mutex_);
  slots_[i]->draining = draining;
}

}  // namespace deepinfer::router
