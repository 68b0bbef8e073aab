#include "server/api_server.h"

#include <fmt/format.h>

#include <chrono>

#include "core/logging.h"
#include "engine/prompt_builder.h"
#include "server/api_error.h"
#include "server/generation_job.h"
#include "server/json_fields.h"
#include "server/kv_tier_metrics.h"
#include "tokenizer/jinja/render_context.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

namespace {

const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                         0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

bool equal_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string_view path_of(const HttpRequest& r) {
  std::string_view target(r.target().data(), r.target().size());
  const size_t q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

void send_json(const std::shared_ptr<ResponseChannel>& ch, int status, const ojson& body) {
  ch->send(status, "application/json", dump_json(body));
}

}  // namespace

ApiServer::ApiServer(AsyncEngine& engine, ApiServerOptions options)
    : engine_(engine),
      options_(std::move(options)),
      metrics_({{"model_name", options_.served_model_name}}),
      workers_(options_.request_workers, options_.max_queued_requests) {
  started_at_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (options_.role == ServeRole::Prefill) {
    export_fence_ = std::make_unique<KvExportFence>(
        options_.kv_export_timeout, &metrics_.counter("deepinfer:kv_export_total", "", {{"result", "persisted"}}),
        &metrics_.counter("deepinfer:kv_export_total", "", {{"result", "timeout"}}));
  }
  render_metrics();  // registers every family so /metrics lists them from the start
}

ApiServer::~ApiServer() = default;

std::string ApiServer::render_metrics() {
  const AsyncEngineStats s = engine_.stats();
  MetricsRegistry& m = metrics_;
  m.gauge("deepinfer:num_requests_running", "Requests in model execution batches.").set(static_cast<double>(s.engine.num_running));
  m.gauge("deepinfer:num_requests_waiting", "Requests waiting to be scheduled (including those not yet handed to the engine).")
      .set(static_cast<double>(s.engine.num_waiting + s.num_queued));
  m.gauge("deepinfer:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.").set(s.engine.kv_usage);
  m.counter("deepinfer:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.")
      .set(static_cast<double>(s.engine.prefix_query_tokens));
  m.counter("deepinfer:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.")
      .set(static_cast<double>(s.engine.prefix_hit_tokens));
  m.counter("deepinfer:num_preemptions_total", "Preemptions (a request gave up its KV and recomputes it later).")
      .set(static_cast<double>(s.engine.num_preemptions));
  m.counter("deepinfer:prompt_tokens_total", "Prompt tokens admitted.").set(static_cast<double>(s.engine.prompt_tokens));
  m.counter("deepinfer:generation_tokens_total", "Tokens generated.").set(static_cast<double>(s.engine.generation_tokens));
  // Draining: the loop still runs (requests in flight finish) though /ready says no.
  const bool alive = !engine_.dead() && (engine_.ready() || (engine_.draining() && engine_.engine()));
  m.gauge("deepinfer:engine_alive", "1 while the engine loop runs.").set(alive ? 1 : 0);
  m.counter("deepinfer:numerical_faults_total", "Requests ended because the model's logits allowed no token (NaN or inf).")
      .set(static_cast<double>(s.engine.numerical_faults));
  for (const auto& [result, value] : {std::pair{"compiled", s.engine.grammar_compiled},
                                      std::pair{"cache_hit", s.engine.grammar_cache_hits},
                                      std::pair{"invalid", s.engine.grammar_invalid},
                                      std::pair{"timed_out", s.engine.grammar_timed_out}}) {
    m.counter("deepinfer:structured_output_compilations_total",
              "Structured-output constraints looked up, by result (compiled, found compiled, refused as invalid, "
              "over the time budget).",
              {{"result", result}})
        .set(static_cast<double>(value));
  }
  m.counter("deepinfer:structured_output_masked_rows_total", "Sampled rows masked by a grammar.")
      .set(static_cast<double>(s.engine.grammar_masked_rows));
  m.counter("deepinfer:structured_output_mask_seconds_total",
            "Host time spent filling grammar token masks (overlapped with the device's forward).")
      .set(s.engine.grammar_mask_ms / 1e3);
  if (s.engine.kv_tiers) render_kv_tier_metrics(metrics_, s.engine);
  if (s.engine.kv_export_server) render_kv_export_metrics(metrics_, s.engine);
  if (s.engine.eplb) {
    // Only with --eplb-ep-size: a model without the statistics has no moe_lb to report.
    m.gauge("deepinfer:moe_lb", "MoE load balance over the EPLB window: max rank load / mean rank load for the "
                                "current (simulated) expert placement, mean over MoE layers; 1 is perfect.")
        .set(s.engine.moe_lb);
    m.gauge("deepinfer:moe_lb_contiguous", "moe_lb of the contiguous expert placement (no re-placement) over the "
                                           "same window.")
        .set(s.engine.moe_lb_contiguous);
    m.counter("deepinfer:eplb_replacements_total", "EPLB expert re-placements.")
        .set(static_cast<double>(s.engine.eplb_replacements));
  }
  if (s.engine.speculative) {
    // Only with --speculative-config, under vLLM's names.
    const SpecDecodeStats& sp = s.engine.spec;
    m.counter("deepinfer:spec_decode_num_drafts_total", "Verifications of drafts (one per request and step).")
        .set(static_cast<double>(sp.num_drafts));
    m.counter("deepinfer:spec_decode_num_draft_tokens_total", "Draft tokens verified.")
        .set(static_cast<double>(sp.num_draft_tokens));
    m.counter("deepinfer:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.")
        .set(static_cast<double>(sp.num_accepted_tokens));
    m.counter("deepinfer:spec_decode_num_proposed_tokens_total",
              "Draft tokens proposed, before the dynamic verify length chose which to verify.")
        .set(static_cast<double>(sp.num_proposed_tokens));
    std::vector<double> bounds;
    std::vector<uint64_t> counts;
    double sum = 0;
    for (size_t n = 0; n < sp.acceptance_lengths.size(); ++n) {
      bounds.push_back(static_cast<double>(n));
      counts.push_back(static_cast<uint64_t>(sp.acceptance_lengths[n]));
      sum += static_cast<double>(n) * static_cast<double>(sp.acceptance_lengths[n]);
    }
    counts.push_back(0);  // +Inf
    m.histogram("deepinfer:spec_decode_acceptance_length", "Draft tokens accepted per verification.", bounds)
        .assign(std::move(counts), sum);
  }
  for (const char* reason : {"stop", "length", "abort"}) {
    m.counter("deepinfer:request_success_total", "Finished requests (per sample) by finish reason.", {{"finished_reason", reason}});
  }
  m.counter("deepinfer:num_requests_rejected_total", "Requests refused with 429 because the admission queue was full.");
  m.histogram("deepinfer:time_to_first_token_seconds", "Time to first token.", kTtftBuckets);
  m.histogram("deepinfer:inter_token_latency_seconds", "Time between output tokens.", kItlBuckets);
  m.histogram("deepinfer:e2e_request_latency_seconds", "End-to-end request latency.", kLatencyBuckets);
  m.histogram("deepinfer:request_queue_time_seconds", "Time from arrival to first scheduling.", kLatencyBuckets);
  return m.render();
}

bool ApiServer::authorized(const HttpRequest& r) const {
  if (options_.api_key.empty()) return true;
  if (auto it = r.find(http::field::authorization); it != r.end()) {
    std::string_view v(it->value().data(), it->value().size());
    if (v.substr(0, 7) == "Bearer " && equal_constant_time(v.substr(7), options_.api_key)) return true;
  }
  if (auto it = r.find("x-api-key"); it != r.end()) {
    if (equal_constant_time(std::string_view(it->value().data(), it->value().size()), options_.api_key)) return true;
  }
  return false;
}

const PromptBuilder& ApiServer::prompts() {
  const Engine* engine = engine_.engine();
  if (!engine) throw ApiError(503, "the model is still loading", {}, "overloaded_error");
  std::call_once(prompts_once_, [&] { prompts_ = std::make_unique<PromptBuilder>(engine->tokenizer()); });
  return *prompts_;
}

void ApiServer::handle(HttpRequest&& request, std::shared_ptr<ResponseChannel> channel) {
  if (request.body().empty()) {
    handle_now(request, channel);
    return;
  }
  auto owned = std::make_shared<HttpRequest>(std::move(request));
  const bool queued = workers_.try_submit([this, owned, channel] { handle_now(*owned, channel); });
  if (!queued) {
    const Api api = path_of(*owned).substr(0, 12) == "/v1/messages" ? Api::Messages : Api::Chat;
    send_json(channel, 503,
              error_body(api, 503, "the server is busy reading other requests; retry later", "overloaded_error", ""));
  }
}

void ApiServer::handle_now(const HttpRequest& request, const std::shared_ptr<ResponseChannel>& channel) {
  Api api = Api::Chat;
  try {
    dispatch(request, channel, api);
  } catch (const ApiError& e) {
    send_json(channel, e.status(), error_body(api, e.status(), e.what(), e.type(), e.param()));
  } catch (const ParamError& e) {
    send_json(channel, 400, error_body(api, 400, e.what(), "invalid_request_error", e.param()));
  } catch (const jinja::TemplateRaisedError& e) {
    send_json(channel, 400, error_body(api, 400, e.what(), "invalid_request_error", "messages"));
  } catch (const Error& e) {
    // Errors from the tokenizer or template come from what the client sent.
    send_json(channel, 400, error_body(api, 400, e.what(), "invalid_request_error", ""));
  } catch (const std::exception& e) {
    log_error("internal error on {} {}: {}", std::string(request.method_string()), std::string(path_of(request)), e.what());
    send_json(channel, 500, error_body(api, 500, "internal server error", "api_error", ""));
  }
}

void ApiServer::dispatch(const HttpRequest& r, const std::shared_ptr<ResponseChannel>& ch, Api& api) {
  const std::string_view path = path_of(r);
  const bool get = r.method() == http::verb::get;
  const bool post = r.method() == http::verb::post;
  if (path.substr(0, 12) == "/v1/messages") api = Api::Messages;
  auto require = [&](bool ok) {
    if (!ok) throw ApiError(405, fmt::format("method {} is not allowed on {}", std::string(r.method_string()), path));
  };
  if (path == "/health") {
    require(get);
    if (engine_.dead()) throw ApiError(503, engine_.error(), {}, "api_error");
    if (engine_.draining()) throw ApiError(503, "the server is shutting down", {}, "overloaded_error");
    ch->send(200, "application/json", "{}");
    return;
  }
  if (path == "/ready") {
    require(get);
    if (!engine_.ready()) {
      throw ApiError(503, engine_.dead()       ? engine_.error()
                          : engine_.draining() ? "the server is shutting down"
                                               : "the model is still loading",
                     {}, "overloaded_error");
    }
    ch->send(200, "application/json", R"({"status":"ready"})");
    return;
  }
  if (path == "/version") {
    // vLLM's endpoint: clients read the engine's version from it.
    require(get);
    send_json(ch, 200, {{"version", DEEPINFER_VERSION}});
    return;
  }
  if (path == "/metrics") {
    require(get);
    ch->send(200, "text/plain; version=0.0.4; charset=utf-8", render_metrics());
    return;
  }
  if (!authorized(r)) throw ApiError(401, "invalid or missing API key", {}, "authentication_error");
  if (path == "/server_info") {
    // What a router learns about this backend: its role, model and limits.
    require(get);
    const Engine* e = engine_.engine();
    ojson info = {{"role", serve_role_name(options_.role)}, {"model", options_.served_model_name},
                  {"version", DEEPINFER_VERSION}, {"ready", engine_.ready()}};
    if (e) {
      info["max_model_len"] = e->max_model_len();
      info["kv_cache_dir"] = e->kv_tiers() != nullptr && e->kv_tiers()->disk_enabled();
      // The shared pool a prefill engine hands KV over in (--kv-transport shared).
      if (e->kv_tiers() != nullptr && !e->kv_tiers()->shared_pool_name().empty()) {
        info["kv_shared_pool"] = e->kv_tiers()->shared_pool_name();
      }
      // Where other nodes' decode engines fetch this engine's KV (--kv-transport ucx).
      if (e->kv_tiers() != nullptr && !e->kv_tiers()->export_source().empty()) {
        info["kv_export_source"] = e->kv_tiers()->export_source();
      }
    }
    send_json(ch, 200, info);
    return;
  }
  if (path == "/v1/models") {
    require(get);
    const Engine* e = engine_.engine();
    ojson model = {{"id", options_.served_model_name}, {"object", "model"}, {"created", started_at_},
                   {"owned_by", "deepinfer"}, {"root", options_.served_model_name}, {"parent", nullptr}};
    if (e) model["max_model_len"] = e->max_model_len();
    send_json(ch, 200, {{"object", "list"}, {"data", ojson::array({model})}});
    return;
  }
  struct GenRoute {
    const char* path;
    Api api;
  };
  for (const GenRoute& g : {GenRoute{"/v1/chat/completions", Api::Chat}, GenRoute{"/v1/completions", Api::Completion},
                            GenRoute{"/v1/responses", Api::Responses}, GenRoute{"/v1/messages", Api::Messages}}) {
    if (path == g.path) {
      require(post);
      api = g.api;
      generate(g.api, r, ch);
      return;
    }
  }
  if (path == "/v1/messages/count_tokens") {
    require(post);
    count_tokens(r, ch);
    return;
  }
  if (path == "/tokenize") {
    require(post);
    tokenize(r, ch);
    return;
  }
  if (path == "/detokenize") {
    require(post);
    detokenize(r, ch);
    return;
  }
  throw ApiError(404, fmt::format("no route for {}", path), {}, "not_found_error");
}

std::vector<int32_t> ApiServer::chat_prompt(const GenerationRequest& r) {
  const PromptBuilder& pb = prompts();
  const ojson tools = r.tool_choice == ToolChoice::None ? ojson() : r.tools;
  try {
    return pb.encode_chat(r.messages, tools, r.chat_template_kwargs, r.add_generation_prompt, r.continue_final_message);
  } catch (const Error& e) {
    if (r.continue_final_message) throw ApiError(400, e.what(), "continue_final_message");
    throw;
  }
}

namespace {

// tool_choice "required" (Anthropic "any") or a named function: the output
// must be a call, so it is constrained to one call of the allowed tools in the
// template's format, its arguments valid for the tool's parameter schema.
// "auto" with at least one strict tool: the model chooses between text and
// calls, and a call it opens is held to the tools' schemas (strict ones) —
// what `strict: true` promises. "auto" without strict tools is left free.
void constrain_tool_choice(GenerationRequest& req, ToolCallFormat format) {
  if (req.tools.is_null() || req.tool_choice == ToolChoice::None) return;
  bool any_strict = false;
  for (const ojson& t : req.tools) any_strict = any_strict || t["function"].value("strict", false);
  const bool forced = req.tool_choice == ToolChoice::Required || req.tool_choice == ToolChoice::Named;
  if (!forced && !any_strict) return;
  if (req.params.structured_outputs) {
    // A response format next to tools the model may call: the tools' grammar
    // would have to admit the format's text too; not combined yet.
    if (!forced) return;
    bad_param("tool_choice", fmt::format("tool_choice '{}' and '{}' both constrain the output; give one",
                                         req.tool_choice == ToolChoice::Named ? req.tool_choice_name : "required",
                                         req.params.structured_outputs->param));
  }
  if (format == ToolCallFormat::None) {
    if (!forced) return;
    bad_param("tool_choice", "this model's chat template has no tool-call format to constrain the output to");
  }
  ojson tools = ojson::array();
  for (const ojson& t : req.tools) {
    const ojson& fn = t["function"];
    if (req.tool_choice == ToolChoice::Named && fn["name"] != req.tool_choice_name) continue;
    ojson tool = {{"name", fn["name"]}, {"strict", forced || fn.value("strict", false)}};
    if (fn.contains("parameters")) tool["parameters"] = fn["parameters"];
    tools.push_back(std::move(tool));
  }
  StructuredOutputs so;
  so.kind = StructuredOutputs::Kind::ToolCall;
  so.param = "tool_choice";
  const char* name = format == ToolCallFormat::Llama3Json   ? "llama3_json"
                     : format == ToolCallFormat::DeepSeekV3 ? "deepseek_v3"
                                                            : "hermes";
  so.spec = ojson{{"format", name}, {"mode", forced ? "required" : "auto"}, {"tools", tools}}.dump();
  req.params.structured_outputs = std::move(so);
}

}  // namespace

void ApiServer::generate(Api api, const HttpRequest& r, const std::shared_ptr<ResponseChannel>& ch) {
  const ojson body = parse_json_body(r.body(), options_.limits.max_json_depth);
  GenerationRequest req = api == Api::Chat         ? parse_chat_request(body, options_.limits)
                          : api == Api::Completion ? parse_completion_request(body, options_.limits)
                          : api == Api::Responses  ? parse_responses_request(body, options_.limits)
                                                   : parse_messages_request(body, options_.limits);
  if (!req.ignored_fields.empty()) {
    // A hostile request may carry 100k unknown keys: the log line names a few.
    constexpr size_t kNamed = 8;
    const auto& f = req.ignored_fields;
    const size_t named = std::min(f.size(), kNamed);
    log_info("ignoring unknown request fields: {}{}", fmt::join(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(named), ", "),
             f.size() > named ? fmt::format(" and {} more", f.size() - named) : std::string());
  }
  if (!req.model.empty() && req.model != options_.served_model_name) {
    throw ApiError(404, fmt::format("The model `{}` does not exist.", req.model), "model", "not_found_error");
  }
  const PromptBuilder& pb = prompts();
  const Engine* engine = engine_.engine();
  validate_for_model(req, engine->vocab_size());
  constrain_tool_choice(req, tool_call_format_for_template(pb.chat_template_source()));
  if (req.params.structured_outputs) {
    // Compiled here, on the request's worker thread: an invalid or too costly
    // schema is a 400 now, and the engine thread finds the grammar cached.
    try {
      engine->compile_grammar(*req.params.structured_outputs);
    } catch (const ParamError& e) {
      throw ApiError(400, e.what(), e.param());
    }
  }
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;
  if (api == Api::Completion) {
    for (const std::string& p : req.prompts) prompts.push_back(pb.encode_prompt(p));
    for (auto& ids : req.prompt_ids) prompts.push_back(ids);
    if (req.echo) {
      texts = req.prompts;
      for (const auto& ids : req.prompt_ids) texts.push_back(engine->tokenizer().decode(ids, false));
    }
  } else {
    prompts.push_back(chat_prompt(req));
  }
  // A prefill engine computes the prompt and one token; its decode engine the rest.
  if (options_.role == ServeRole::Prefill) req.params.max_tokens = 1;
  for (const auto& p : prompts) {
    if (p.empty()) bad_param("prompt", "the prompt is empty");
    check_prompt_length(req.params, p.size(), engine->max_model_len());
  }
  JobContext ctx;
  ctx.engine = &engine_;
  ctx.tokenizer = &engine->tokenizer();
  ctx.model_name = options_.served_model_name;
  ctx.tool_format = tool_call_format_for_template(pb.chat_template_source());
  ctx.reasoning = template_has_reasoning(pb.chat_template_source());
  ctx.metrics.ttft = &metrics_.histogram("deepinfer:time_to_first_token_seconds", "", kTtftBuckets);
  ctx.metrics.inter_token = &metrics_.histogram("deepinfer:inter_token_latency_seconds", "", kItlBuckets);
  ctx.metrics.e2e = &metrics_.histogram("deepinfer:e2e_request_latency_seconds", "", kLatencyBuckets);
  ctx.metrics.queue_time = &metrics_.histogram("deepinfer:request_queue_time_seconds", "", kLatencyBuckets);
  ctx.metrics.success_stop = &metrics_.counter("deepinfer:request_success_total", "", {{"finished_reason", "stop"}});
  ctx.metrics.success_length = &metrics_.counter("deepinfer:request_success_total", "", {{"finished_reason", "length"}});
  ctx.metrics.success_abort = &metrics_.counter("deepinfer:request_success_total", "", {{"finished_reason", "abort"}});
  ctx.metrics.rejected = &metrics_.counter("deepinfer:num_requests_rejected_total", "");
  if (options_.role != ServeRole::Prefill) {
    // A decode engine told (by the router) where the prompt's KV is: a prefill
    // engine's shared pool on this node (mapped before the request looks for
    // its blocks), or an engine on another node (ucx://, fetched when the
    // request is added).
    if (auto it = r.find("x-deepinfer-kv-source"); it != r.end()) {
      const std::string_view source(it->value().data(), it->value().size());
      if (source.starts_with("ucx://")) {
        req.kv_source.assign(source);
      } else {
        engine_.attach_kv_peer(source);
      }
    }
  }
  if (export_fence_ && engine->kv_tiers() && engine->kv_tiers()->exports()) {
    ctx.export_fence = export_fence_.get();
    ctx.export_tiers = engine->kv_tiers();
  }
  auto job = std::make_shared<GenerationJob>(std::move(ctx), std::move(req), std::move(prompts), std::move(texts), ch);
  // The job lives on the connection's strand, where its engine events arrive.
  ch->post([job, ch, api] {
    try {
      job->start();
    } catch (const std::exception& e) {
      log_error("starting a generation failed: {}", e.what());
      send_json(ch, 500, error_body(api, 500, "internal server error", "api_error", ""));
    }
  });
}

void ApiServer::tokenize(const HttpRequest& r, const std::shared_ptr<ResponseChannel>& ch) {
  const ojson body = parse_json_body(r.body(), options_.limits.max_json_depth);
  const PromptBuilder& pb = prompts();
  const Engine* engine = engine_.engine();
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    const ojson messages = parse_chat_messages(body["messages"], options_.limits);
    const bool add_gen = read_bool(body, "add_generation_prompt", true);
    ids = engine->tokenizer().encode(pb.apply_chat_template(messages, nullptr, add_gen), false);
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || !p->is_string()) bad_param("prompt", "'prompt' (string) or 'messages' is required");
    const bool add_special = read_bool(body, "add_special_tokens", true);
    ids = engine->tokenizer().encode(p->get<std::string>(), add_special);
  }
  send_json(ch, 200, {{"count", ids.size()}, {"max_model_len", engine->max_model_len()}, {"tokens", ids}});
}

void ApiServer::detokenize(const HttpRequest& r, const std::shared_ptr<ResponseChannel>& ch) {
  const ojson body = parse_json_body(r.body(), options_.limits.max_json_depth);
  prompts();
  const Engine* engine = engine_.engine();
  auto t = body.find("tokens");
  if (t == body.end() || !t->is_array()) bad_param("tokens", "'tokens' must be a list of token ids");
  if (t->size() > options_.limits.max_prompt_ids) bad_param("tokens", "too many tokens");
  std::vector<int32_t> ids;
  for (const ojson& v : *t) {
    if (!v.is_number_integer()) bad_param("tokens", "token ids must be integers");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= engine->vocab_size()) bad_param("tokens", fmt::format("token id {} is outside the vocabulary", id));
    ids.push_back(static_cast<int32_t>(id));
  }
  send_json(ch, 200, {{"prompt", engine->tokenizer().decode(ids, false)}});
}

void ApiServer::count_tokens(const HttpRequest& r, const std::shared_ptr<ResponseChannel>& ch) {
  ojson body = parse_json_body(r.body(), options_.limits.max_json_depth);
  if (!body.contains("max_tokens")) body["max_tokens"] = 1;  // not part of count_tokens requests
  GenerationRequest req = parse_messages_request(body, options_.limits);
  send_json(ch, 200, {{"input_tokens", chat_prompt(req).size()}});
}

}  // namespace deepinfer::server
