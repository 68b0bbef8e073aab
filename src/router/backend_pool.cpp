#include "router/backend_pool.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer::router {

BackendPool::BackendPool(std::vector<Url> urls, Options options)
    : options_(std::move(options)), slots_(std::make_unique<std::unique_ptr<Slot>[]>(kMaxBackends)) {
  DI_CHECK(urls.size() <= kMaxBackends, "router: at most {} backends", kMaxBackends);
  for (Url& u : urls) {
    auto slot = std::make_unique<Slot>();
    slot->url = std::move(u);
    slots_[count_.load()] = std::move(slot);
    count_.fetch_add(1);
  }
}

BackendPool::~BackendPool() { stop(); }

void BackendPool::start() {
  if (options_.discover) {
    if (auto urls = options_.discover()) update_members(*urls);
  }
  for (size_t i = 0; i < size(); ++i) check(i);
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
    if (options_.discover) {
      if (auto urls = options_.discover()) update_members(*urls);
    }
    for (size_t i = 0; i < size(); ++i) check(i);
  }
}

void BackendPool::update_members(const std::vector<std::string>& urls) {
  std::vector<Url> named;
  for (const std::string& u : urls) {
    try {
      named.push_back(parse_url(u));
    } catch (const std::exception& e) {
      log_debug("router: discovery named '{}', not a backend URL: {}", u.substr(0, 200), e.what());
    }
  }
  std::lock_guard lock(mutex_);
  const size_t n = count_.load();
  for (size_t i = 0; i < n; ++i) {
    Slot& s = *slots_[i];
    const bool listed = std::any_of(named.begin(), named.end(), [&](const Url& u) { return u.str() == s.url.str(); });
    if (listed != s.listed) log_info("router: backend {} {} the pool", s.url.str(), listed ? "rejoins" : "leaves");
    if (!listed && s.listed) {
      s.healthy = false;
      s.was_down = true;  // its cache is unknown when it comes back
    }
    s.listed = listed;
  }
  for (const Url& u : named) {
    const size_t now = count_.load();
    bool have = false;
    for (size_t i = 0; i < now && !have; ++i) have = slots_[i]->url.str() == u.str();
    if (have) continue;
    if (now >= kMaxBackends) {
      log_warn("router: already {} backends; {} not added", kMaxBackends, u.str());
      break;
    }
    auto slot = std::make_unique<Slot>();
    slot->url = u;
    slots_[now] = std::move(slot);
    count_.fetch_add(1);
    log_info("router: backend {} joins the pool", u.str());
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
  const size_t n = count_.load();
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const Slot& s = *slots_[i];
    if (!s.listed) continue;
    out.push_back({i, s.url, s.role, s.model, s.max_model_len, s.known, s.healthy, s.draining, s.listed, s.load.load()});
  }
  return out;
}

std::optional<size_t> BackendPool::find(const std::string& url) const {
  const size_t n = count_.load();
  for (size_t i = 0; i < n; ++i) {
    if (slots_[i]->url.str() == url) return i;
  }
  try {
    const std::string normal = parse_url(url).str();
    for (size_t i = 0; i < n; ++i) {
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
