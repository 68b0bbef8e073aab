// deepinfer._core: the C++ engine for the Python package (python/deepinfer).
// Requests and outputs cross the boundary as the JSON objects of
// `deepinfer generate --input/--output` (engine/generate_io.h), so Python and
// the CLI parse and report them with the same code. The GIL is released while
// the engine runs; one mutex serialises callers of the (single-threaded) LLM.
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <CLI/CLI.hpp>
#include <mutex>
#include <unordered_set>

#include "core/error.h"
#include "core/json_parse.h"
#include "core/logging.h"
#include "deepinfer/llm.h"
#include "engine/generate_io.h"
#include "tokenizer/tokenizer.h"
#include "engine_flags.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace deepinfer {
namespace {

// Raised for a bad sampling parameter; carries the field's name (ParamError).
// A plain pointer, deliberately never released: module globals outlive the
// interpreter's teardown.
PyObject* param_error_type = nullptr;

nlohmann::ordered_json parse_request(const std::string& text, const std::string& where) {
  JsonLimits limits;
  limits.duplicates = DuplicateKeys::LastWins;
  return parse_ordered_json(text, where, limits);
}

nlohmann::json delta_json(const CompletionDelta& d, bool with_logprobs) {
  nlohmann::json j{{"index", d.choice}, {"text", d.text}, {"finished", d.finished}};
  nlohmann::json ids = nlohmann::json::array();
  for (const TokenOutput& t : d.tokens) ids.push_back(t.token);
  j["token_ids"] = ids;
  if (with_logprobs) {
    CompletionChoice c;
    c.logprobs = d.tokens;
    j["logprobs"] = choice_json(c)["logprobs"];
  }
  if (d.finished) {
    j["finish_reason"] = std::string(to_string(d.finish_reason));
    if (!d.stop_reason.empty()) j["stop_reason"] = d.stop_reason;
    if (!d.error.empty()) j["error"] = d.error;
  }
  return j;
}

class PyEngine {
 public:
  explicit PyEngine(std::vector<std::string> args) {
    CLI::App app{"deepinfer engine"};
    cli::EngineFlags flags;
    flags.start_local_ranks = false;
    cli::add_engine_flags(app, flags);
    std::vector<std::string> argv_rev(args.rbegin(), args.rend());
    try {
      app.parse(argv_rev);
    } catch (const CLI::ParseError& e) {
      throw nb::value_error(fmt::format("invalid engine argument: {}", e.what()).c_str());
    }
    DI_CHECK(!flags.config.model_path.empty() || std::getenv("DEEPINFER_HF_MODEL_DIR"),
             "no model given (the Python package resolves the default model before calling the engine)");
    EngineConfig config = cli::finish_engine_flags(flags, "python");
    nb::gil_scoped_release release;
    llm_ = std::make_unique<LLM>(std::move(config));
  }

  // Runs a batch of request objects (JSON text); returns one output object per
  // request, in order. `progress(finished, total, generated_tokens)` is called
  // with the GIL held as requests finish; an exception it raises (e.g.
  // KeyboardInterrupt from a signal check) aborts the batch.
  std::vector<std::string> generate(const std::vector<std::string>& requests, nb::object progress) {
    std::vector<GenerateInput> inputs;
    inputs.reserve(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::string where = fmt::format("request {}", i);
      inputs.push_back(parse_generate_input(parse_request(requests[i], where), {}, where));
    }
    std::vector<CompletionOutput> outputs;
    {
      nb::gil_scoped_release release;
      std::lock_guard lock(mutex_);
      outputs = llm_->generate(inputs, [&](const GenerateProgress& p) {
        nb::gil_scoped_acquire acquire;
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
        if (!progress.is_none()) progress(p.finished, p.total, p.generated_tokens);
      });
    }
    const bool spec = llm_->engine().config().speculative.enabled();
    std::vector<std::string> out;
    out.reserve(outputs.size());
    for (const CompletionOutput& o : outputs) out.push_back(completion_json(o, spec, /*with_prompt_ids=*/true).dump());
    return out;
  }

  // Starts a streamed request; returns its handle.
  uint64_t submit(const std::string& request) {
    GenerateInput input = parse_generate_input(parse_request(request, "request"), {}, "request");
    nb::gil_scoped_release release;
    std::lock_guard lock(mutex_);
    const bool logprobs = input.params.logprobs.has_value();
    const GenerationHandle h = llm_->submit(input, /*keep_deltas=*/true);
    if (logprobs) with_logprobs_.insert(h);
    return h;
  }

  // Steps the engine until the handle has new output or has finished; returns
  // the new pieces (a JSON list of deltas, empty once finished and drained).
  std::string next(uint64_t handle) {
    std::vector<CompletionDelta> deltas;
    bool logprobs = false;
    {
      nb::gil_scoped_release release;
      std::lock_guard lock(mutex_);
      for (;;) {
        deltas = llm_->take_deltas(handle);
        if (!deltas.empty() || llm_->finished(handle)) break;
        llm_->step();
      }
      logprobs = with_logprobs_.count(handle) > 0;
    }
    nlohmann::json j = nlohmann::json::array();
    for (const CompletionDelta& d : deltas) j.push_back(delta_json(d, logprobs));
    return j.dump();
  }

  // The whole output of a finished streamed request (then forgotten).
  std::string take(uint64_t handle) {
    // Every method that takes the mutex lets go of the GIL first: a batch
    // holding the mutex needs the GIL for its progress callback.
    nb::gil_scoped_release release;
    std::lock_guard lock(mutex_);
    with_logprobs_.erase(handle);
    return completion_json(llm_->take(handle), llm_->engine().config().speculative.enabled(), true).dump();
  }

  void release(uint64_t handle) {
    nb::gil_scoped_release release;
    std::lock_guard lock(mutex_);
    with_logprobs_.erase(handle);
    llm_->release(handle);
  }

  std::string apply_chat_template(const std::string& messages, const std::string& tools, bool add_generation_prompt) {
    nlohmann::json m = nlohmann::json::parse(messages);
    nlohmann::json t = tools.empty() ? nlohmann::json() : nlohmann::json::parse(tools);
    return llm_->apply_chat_template(m, t, add_generation_prompt);
  }

  std::vector<int32_t> prompt_token_ids(const std::string& request) {
    return llm_->prompt_ids(parse_generate_input(parse_request(request, "request"), {}, "request"));
  }

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    return llm_->engine().tokenizer().encode(text, add_special_tokens);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    return llm_->engine().tokenizer().decode(ids, skip_special_tokens);
  }
  int32_t vocab_size() const { return llm_->engine().vocab_size(); }
  int32_t max_model_len() const { return llm_->engine().max_model_len(); }

  std::string stats() {
    nb::gil_scoped_release release;
    std::lock_guard lock(mutex_);
    const EngineStats s = llm_->engine().stats();
    nlohmann::json j{{"steps", s.steps},
                     {"prompt_tokens", s.prompt_tokens},
                     {"generation_tokens", s.generation_tokens},
                     {"prefix_query_tokens", s.prefix_query_tokens},
                     {"prefix_hit_tokens", s.prefix_hit_tokens},
                     {"num_preemptions", s.num_preemptions},
                     {"device_busy_ms", s.device_busy_ms},
                     {"device_idle_ms", s.device_idle_ms},
                     {"kv_usage", s.kv_usage}};
    if (s.speculative) {
      j["spec_num_drafts"] = s.spec.num_drafts;
      j["spec_num_draft_tokens"] = s.spec.num_draft_tokens;
      j["spec_num_accepted_tokens"] = s.spec.num_accepted_tokens;
    }
    return j.dump();
  }

 private:
  std::mutex mutex_;
  std::unique_ptr<LLM> llm_;
  std::unordered_set<GenerationHandle> with_logprobs_;
};

}  // namespace
}  // namespace deepinfer

NB_MODULE(_core, m) {
  using deepinfer::PyEngine;
  m.doc() = "DeepInfer's C++ engine (use the deepinfer package, not this module)";
  deepinfer::set_log_level(deepinfer::LogLevel::Warn);
  // ParamError: a ValueError subclass naming the sampling field.
  deepinfer::param_error_type = PyErr_NewException("deepinfer._core.ParamError", PyExc_ValueError, nullptr);
  m.attr("ParamError") = nb::handle(deepinfer::param_error_type);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const deepinfer::ParamError& e) {
      PyObject* err = PyObject_CallFunction(deepinfer::param_error_type, "s", e.what());
      if (err == nullptr) return;  // the call's own error stands
      PyObject* param = PyUnicode_FromString(e.param().c_str());
      if (param != nullptr) PyObject_SetAttrString(err, "param", param);
      Py_XDECREF(param);
      PyErr_SetObject(deepinfer::param_error_type, err);
      Py_DECREF(err);
    } catch (const deepinfer::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("set_log_level", [](const std::string& level) {
    using deepinfer::LogLevel;
    if (level == "debug") deepinfer::set_log_level(LogLevel::Debug);
    else if (level == "info") deepinfer::set_log_level(LogLevel::Info);
    else if (level == "warning") deepinfer::set_log_level(LogLevel::Warn);
    else if (level == "error") deepinfer::set_log_level(LogLevel::Error);
    else throw nb::value_error("log level must be debug, info, warning or error");
  });
  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<std::vector<std::string>>(), "args"_a)
      .def("generate", &PyEngine::generate, "requests"_a, "progress"_a.none())
      .def("submit", &PyEngine::submit, "request"_a)
      .def("next", &PyEngine::next, "handle"_a)
      .def("take", &PyEngine::take, "handle"_a)
      .def("release", &PyEngine::release, "handle"_a)
      .def("apply_chat_template", &PyEngine::apply_chat_template, "messages"_a, "tools"_a, "add_generation_prompt"_a)
      .def("prompt_token_ids", &PyEngine::prompt_token_ids, "request"_a)
      .def("encode", &PyEngine::encode, "text"_a, "add_special_tokens"_a)
      .def("decode", &PyEngine::decode, "ids"_a, "skip_special_tokens"_a)
      .def_prop_ro("vocab_size", &PyEngine::vocab_size)
      .def_prop_ro("max_model_len", &PyEngine::max_model_len)
      .def("stats", &PyEngine::stats);
}
