#include "server/response_encoder.h"

#include <chrono>

#include "server/encoder_anthropic.h"
#include "server/encoder_chat.h"
#include "server/encoder_common.h"
#include "server/encoder_completions.h"
#include "server/encoder_responses.h"
#include "server/http_server.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

void EventStream::named(const std::string& event, const ojson& data) {
  channel_.write("event: " + event + "\ndata: " + dump_json(data) + "\n\n");
}

void EventStream::data(const ojson& data) { channel_.write("data: " + dump_json(data) + "\n\n"); }

void EventStream::done() { channel_.write("data: [DONE]\n\n"); }

ResponseEncoder::ResponseEncoder(EncoderContext context, const char* id_prefix)
    : ctx_(std::move(context)), id_(random_id(id_prefix)) {
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string ResponseEncoder::new_tool_call_id() const { return random_id("call_"); }

void ResponseEncoder::stream_error(EventStream& out, const std::string& message) const {
  out.data({{"error", {{"message", message}, {"type", "api_error"}, {"code", 500}}}});
}

ojson ResponseEncoder::openai_frame(const char* object, ojson choices) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", ctx_.model_name}, {"choices", std::move(choices)}};
}

void ResponseEncoder::end_openai_stream(EventStream& out, const char* chunk_object,
                                        std::span<const SampleOutput> samples) const {
  if (ctx_.request.include_usage) {
    ojson chunk = openai_frame(chunk_object, ojson::array());
    chunk["usage"] = openai_usage(count_tokens(samples, ctx_));
    out.data(chunk);
  }
  out.done();
}

std::unique_ptr<ResponseEncoder> make_response_encoder(EncoderContext context) {
  switch (context.request.api) {
    case Api::Chat: return std::make_unique<ChatEncoder>(std::move(context));
    case Api::Completion: return std::make_unique<CompletionsEncoder>(std::move(context));
    case Api::Responses: return std::make_unique<ResponsesEncoder>(std::move(context));
    case Api::Messages: return std::make_unique<AnthropicEncoder>(std::move(context));
  }
  return nullptr;
}

}  // namespace deepinfer::server
