#include "loader/json_util.h"

#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace deepinfer {

nlohmann::json parse_json_strict(std::string_view text, std::string_view what) {
  using nlohmann::json;
  std::vector<std::set<std::string, std::less<>>> open_objects;
  std::string duplicate;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (duplicate.empty() && !open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", what, e.what());
  }
  DI_CHECK(duplicate.empty(), "{}: key '{}' appears twice in one object", what, duplicate);
  return doc;
}

}  // namespace deepinfer
