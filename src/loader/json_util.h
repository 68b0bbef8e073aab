// JSON parsing for the loaders: errors become deepinfer::Error, and duplicate
// keys are rejected (nlohmann::json would silently keep the last one, e.g. the
// second of two tensors with the same name).
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace deepinfer {

// `what` names the document in error messages ("safetensors header", a path).
nlohmann::json parse_json_strict(std::string_view text, std::string_view what);

}  // namespace deepinfer
