#include "core/json_parse.h"

#include <fstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace deepinfer {

namespace {

// SAX handler that builds the document with bounded nesting. Values are placed
// into their parent as soon as they start, so the stack holds only open
// containers; a child's address stays valid because its parent is not touched
// until the child is closed.
template <typename Json>
class BoundedDomBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;
  static constexpr bool kOrdered = std::is_same_v<Json, nlohmann::ordered_json>;

  BoundedDomBuilder(Json& root, const JsonLimits& limits) : root_(root), limits_(limits) {}

  bool null() { return place(Json(nullptr)) != nullptr; }
  bool boolean(bool v) { return place(Json(v)) != nullptr; }
  bool number_integer(number_integer_t v) { return place(Json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) { return place(Json(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) { return place(Json(v)) != nullptr; }
  bool string(string_t& v) { return place(Json(std::move(v))) != nullptr; }
  bool binary(binary_t& v) { return place(Json::binary(std::move(v))) != nullptr; }

  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    Frame& f = stack_.back();
    auto& object = f.value->template get_ref<typename Json::object_t&>();
    if constexpr (kOrdered) {
      // ordered_map::emplace searches linearly; an index per open object keeps
      // the build linear.
      using Container = typename Json::object_t::Container;
      auto& entries = static_cast<Container&>(object);
      auto [it, fresh] = f.key_index.try_emplace(k, entries.size());
      if (!fresh) {
        if (limits_.duplicates == DuplicateKeys::Reject) return duplicate(k);
        pending_ = &entries[it->second].second;
        return true;
      }
      pending_ = &entries.emplace_back(std::move(k), Json()).second;
    } else {
      auto it = object.find(k);
      if (it != object.end()) {
        if (limits_.duplicates == DuplicateKeys::Reject) return duplicate(k);
      } else {
        it = object.emplace(std::move(k), Json()).first;
      }
      pending_ = &it->second;
    }
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = std::string("invalid JSON: ") + e.what();
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  struct Frame {
    Json* value;
    std::unordered_map<std::string, size_t> key_index;  // ordered objects only
  };

  Json* place(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json* parent = stack_.back().value;
    if (parent->is_array()) {
      auto& array = parent->template get_ref<typename Json::array_t&>();
      array.push_back(std::move(v));
      return &array.back();
    }
    *pending_ = std::move(v);
    return pending_;
  }

  bool open(Json&& container) {
    if (static_cast<int64_t>(stack_.size()) >= limits_.max_depth) {
      error_ = "JSON nested deeper than " + std::to_string(limits_.max_depth) + " levels";
      return false;
    }
    stack_.push_back(Frame{place(std::move(container)), {}});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  bool duplicate(std::string_view k) {
    error_ = "key '" + excerpt(k) + "' appears twice in one object";
    return false;
  }

  Json& root_;
  const JsonLimits& limits_;
  std::vector<Frame> stack_;
  Json* pending_ = nullptr;
  std::string error_;
};

template <typename Json>
Json parse_bounded(std::string_view text, std::string_view what, const JsonLimits& limits) {
  Json root;
  BoundedDomBuilder<Json> builder(root, limits);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", what, e.what());
  }
  if (!ok) fail("{}: {}", what, builder.error().empty() ? std::string("invalid JSON") : builder.error());
  return root;
}

}  // namespace

std::string excerpt(std::string_view text) {
  if (text.size() <= kExcerptBytes) return std::string(text);
  return std::string(text.substr(0, kExcerptBytes)) + "...";
}

std::string json_excerpt(const nlohmann::json& value) {
  return excerpt(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

nlohmann::json parse_json(std::string_view text, std::string_view what, const JsonLimits& limits) {
  return parse_bounded<nlohmann::json>(text, what, limits);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view what, const JsonLimits& limits) {
  return parse_bounded<nlohmann::ordered_json>(text, what, limits);
}

void for_each_jsonl_object(const std::string& path, const JsonLimits& limits,
                           const std::function<void(nlohmann::ordered_json&& object, const std::string& where)>& fn) {
  std::ifstream in(path);
  DI_CHECK(in.good(), "cannot read '{}'", path);
  for_each_jsonl_object(in, path, limits, fn);
}

void for_each_jsonl_object(std::istream& in, const std::string& name, const JsonLimits& limits,
                           const std::function<void(nlohmann::ordered_json&& object, const std::string& where)>& fn) {
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = name + ":" + std::to_string(line_no);
    nlohmann::ordered_json j = parse_ordered_json(line, where, limits);
    DI_CHECK(j.is_object(), "{}: not a JSON object", where);
    fn(std::move(j), where);
  }
}

}  // namespace deepinfer
