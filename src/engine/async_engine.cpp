#include "engine/async_engine.h"

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer {

AsyncEngine::AsyncEngine(EngineConfig config, AsyncEngineOptions options) : options_(options) {
  capacity_ = static_cast<size_t>(std::max(config.max_num_seqs, 1)) + options_.max_waiting;
  thread_ = std::thread([this, config = std::move(config)]() mutable { run(std::move(config)); });
}

AsyncEngine::~AsyncEngine() {
  stop_loop();
  if (thread_.joinable()) thread_.join();
}

std::string AsyncEngine::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

bool AsyncEngine::wait_until_loaded() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return state_.load() != State::Loading; });
  return state_.load() == State::Running;
}

void AsyncEngine::run(EngineConfig config) {
  try {
    engine_ = std::make_unique<Engine>(std::move(config));
    if (options_.on_loaded) options_.on_loaded(*engine_);
  } catch (const std::exception& e) {
    std::lock_guard lock(mutex_);
    error_ = std::string("model loading failed: ") + e.what();
    state_ = State::Dead;
    changed_.notify_all();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    loaded_ = true;
    state_ = State::Running;
    stats_.engine = engine_->stats();
    changed_.notify_all();
  }
  try {
    loop();
    // Stopped without a drain: whoever still waits gets a final event.
    fail_all("the server is shutting down");
    std::lock_guard lock(mutex_);
    state_ = State::Stopped;
    changed_.notify_all();
  } catch (const std::exception& e) {
    // A bug in the step loop: every request in flight gets the error, readiness
    // turns false, and the process stays up so that operators can see why.
    const std::string message = std::string("engine loop died: ") + e.what();
    log_error("{}", message);
    fail_all(message);
    std::lock_guard lock(mutex_);
    error_ = message;
    state_ = State::Dead;
    changed_.notify_all();
  }
}

void AsyncEngine::loop() {
  const auto dp = engine_->data_parallel();
  const bool in_group = dp && dp->steps_together;
  std::chrono::microseconds idle_poll = options_.group_idle_poll;
  for (;;) {
    std::deque<Pending> pending;
    std::vector<uint64_t> aborts;
    bool abort_all = false;
    {
      std::unique_lock lock(mutex_);
      auto woken = [&] {
        return stop_ || abort_all_ || !pending_.empty() || !aborts_.empty() || engine_->has_unfinished();
      };
      if (!in_group) {
        wake_.wait(lock, woken);
      } else if (!engine_->group_busy()) {
        // The group steps together: an idle rank still votes, now and then,
        // to hear of another rank's work (and to be heard of its own).
        wake_.wait_for(lock, idle_poll, woken);
        idle_poll = std::min(idle_poll * 2, options_.group_idle_poll_max);
      } else {
        idle_poll = options_.group_idle_poll;
      }
      if (stop_) {
        lock.unlock();
        // A group that steps together: leave with the others (every rank
        // votes `leaving`, padding steps until then), not alone.
        if (in_group) engine_->drain_group();
        break;
      }
      pending.swap(pending_);
      aborts.swap(aborts_);
      std::swap(abort_all, abort_all_);
    }
    size_t refused = 0;
    for (Pending& p : pending) {
      EngineSubmission& s = p.submission;
      try {
        const uint64_t engine_id = engine_->add_request(std::move(s.prompt_ids), std::move(s.params), s.cache_salt, s.kv_source);
        by_engine_id_[engine_id] = p.id;
        live_[p.id] = Live{engine_id, std::move(s.sink)};
      } catch (const std::exception& e) {
        // The server validates first; this is what slipped past it.
        EngineEvent ev;
        ev.output.request_id = p.id;
        ev.output.finished = true;
        ev.output.finish_reason = FinishReason::Abort;
        ev.error = e.what();
        ev.time = Clock::now();
        s.sink(std::move(ev));
        ++refused;
      }
    }
    for (uint64_t id : aborts) {
      auto it = live_.find(id);
      if (it != live_.end()) engine_->abort(it->second.engine_id);
    }
    if (abort_all) {
      for (const auto& [id, live] : live_) engine_->abort(live.engine_id);
    }
    std::vector<RequestOutput> outputs;
    if (engine_->has_unfinished() || in_group) outputs = engine_->step();
    const Clock::time_point now = Clock::now();
    size_t finished = refused;
    for (RequestOutput& out : outputs) {
      auto eit = by_engine_id_.find(out.request_id);
      if (eit == by_engine_id_.end()) continue;
      const uint64_t id = eit->second;
      auto lit = live_.find(id);
      EngineEvent ev;
      ev.time = now;
      if (out.finished) ev.summary = engine_->summary(out.request_id);
      ev.error = std::move(out.error);
      ev.output = std::move(out);
      ev.output.request_id = id;
      const bool done = ev.output.finished;
      lit->second.sink(std::move(ev));
      if (done) {
        live_.erase(lit);
        by_engine_id_.erase(eit);
        ++finished;
      }
    }
    group_leaving_.store(engine_->group_leaving());
    std::lock_guard lock(mutex_);
    in_flight_ -= finished;
    stats_.engine = engine_->stats();
    if (finished) changed_.notify_all();
  }
}

void AsyncEngine::fail_all(const std::string& message) {
  std::deque<Pending> pending;
  {
    std::lock_guard lock(mutex_);
    pending.swap(pending_);
    in_flight_ = 0;
  }
  auto send = [&](uint64_t id, EngineSink& sink) {
    EngineEvent ev;
    ev.output.request_id = id;
    ev.output.finished = true;
    ev.output.finish_reason = FinishReason::Abort;
    ev.error = message;
    ev.time = Clock::now();
    sink(std::move(ev));
  };
  for (Pending& p : pending) send(p.id, p.submission.sink);
  for (auto& [id, live] : live_) send(id, live.sink);
  live_.clear();
  by_engine_id_.clear();
}

SubmitResult AsyncEngine::submit(std::vector<EngineSubmission> group) {
  SubmitResult result;
  std::lock_guard lock(mutex_);
  if (draining_ || stop_) {
    result.status = SubmitStatus::ShuttingDown;
    return result;
  }
  if (state_.load() != State::Running) {
    result.status = SubmitStatus::NotReady;
    return result;
  }
  if (in_flight_ + group.size() > capacity_) {
    result.status = SubmitStatus::QueueFull;
    return result;
  }
  for (EngineSubmission& s : group) {
    const uint64_t id = next_id_++;
    result.ids.push_back(id);
    pending_.push_back({id, std::move(s)});
  }
  in_flight_ += group.size();
  result.status = SubmitStatus::Accepted;
  wake_.notify_one();
  return result;
}

void AsyncEngine::abort(uint64_t id) {
  std::lock_guard lock(mutex_);
  aborts_.push_back(id);
  wake_.notify_one();
}

AsyncEngineStats AsyncEngine::stats() const {
  std::lock_guard lock(mutex_);
  AsyncEngineStats s = stats_;
  s.num_in_flight = in_flight_;
  s.num_queued = pending_.size();
  return s;
}

size_t AsyncEngine::drain(std::chrono::duration<double> timeout) {
  draining_ = true;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  size_t aborted = 0;
  {
    std::unique_lock lock(mutex_);
    changed_.wait_until(lock, deadline, [&] { return in_flight_ == 0 || state_.load() != State::Running; });
    aborted = in_flight_;
  }
  if (aborted > 0 && state_.load() == State::Running) {
    log_warn("shutdown: aborting {} request(s) still running after the drain timeout", aborted);
    {
      std::lock_guard lock(mutex_);
      abort_all_ = true;
      wake_.notify_one();
    }
    // Aborts take effect within one step; bound the wait in case a step is slow.
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(30), [&] { return in_flight_ == 0 || state_.load() != State::Running; });
  }
  stop_loop();
  if (thread_.joinable()) thread_.join();
  return aborted;
}

void AsyncEngine::stop_loop() {
  std::lock_guard lock(mutex_);
  stop_ = true;
  wake_.notify_one();
}

}  // namespace deepinfer
