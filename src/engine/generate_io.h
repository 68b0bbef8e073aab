// The JSON shapes of offline generation, shared by `deepinfer generate --input
// / --output`, the Python package and `deepinfer eval`: one input object per
// prompt ({"prompt"} | {"messages", "tools"} | {"prompt_token_ids"}, plus
// vLLM-named sampling fields and "cache_salt"), and one output object per
// prompt (first sample's fields at the top level, every sample under
// "choices" when n > 1).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "deepinfer/llm.h"

namespace deepinfer {

// Reads one input object. `defaults` are sampling fields applied before the
// object's own (e.g. the CLI's --max-tokens). Throws Error (ParamError for a
// sampling field) naming the problem; `where` prefixes messages (file:line).
GenerateInput parse_generate_input(const nlohmann::ordered_json& object, const nlohmann::ordered_json& defaults,
                                   const std::string& where);

nlohmann::json choice_json(const CompletionChoice& choice);

// One output object. `speculative` adds the draft counters, `with_prompt_ids` the prompt's ids.
nlohmann::json completion_json(const CompletionOutput& output, bool speculative, bool with_prompt_ids = false);

}  // namespace deepinfer
