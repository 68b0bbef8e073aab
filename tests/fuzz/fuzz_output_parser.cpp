// libFuzzer target: model output streamed through the tool-call / reasoning
// parser in chunks (the first byte picks the tool-call format, whether the
// template reasons, and the chunk size), as generation jobs feed it token by
// token. Tool-call JSON inside the text goes through the bounded parser.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "server/output_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::server;
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const ToolCallFormat format = (selector & 1) ? ToolCallFormat::Llama3Json : ToolCallFormat::Hermes;
  OutputParser p(format, (selector & 2) != 0);
  const size_t chunk = 1 + (selector >> 2) % 16;
  for (size_t i = 0; i < text.size(); i += chunk) p.push(text.substr(i, chunk));
  p.finish();
  return 0;
}
