// The Jinja value model: Python-like dynamic values (None, bool, int, float, str,
// list/tuple, insertion-ordered dict, namespace, callable) plus Jinja's Undefined.
// Lists, dicts and namespaces are reference types, as in Python.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace deepinfer::jinja {

class Value;
class RenderContext;

struct ArrayData {
  std::vector<Value> items;
  bool is_tuple = false;
  ArrayData() = default;
  ArrayData(const ArrayData&) = delete;
  ArrayData& operator=(const ArrayData&) = delete;
  ~ArrayData();
};

struct ObjectData {
  std::vector<std::pair<std::string, Value>> entries;
  std::unordered_map<std::string, size_t> index;
  bool is_namespace = false;

  ObjectData() = default;
  ObjectData(const ObjectData&) = delete;
  ObjectData& operator=(const ObjectData&) = delete;
  ~ObjectData();
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFn = std::function<Value(RenderContext&, CallArgs&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

struct UndefinedData {
  // What Jinja would report when the undefined value is used in an erroring way.
  std::string hint;
};

// Python json.dumps options (defaults as transformers' tojson: ensure_ascii=False).
struct JsonFormat {
  bool has_indent = false;
  std::string indent;  // one nesting level
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

using ArrayPtr = std::shared_ptr<ArrayData>;
using ObjectPtr = std::shared_ptr<ObjectData>;
using CallablePtr = std::shared_ptr<const Callable>;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, Array, Object, Callable };

  Value() : v_(UndefinedData{}) {}
  static Value undefined(std::string hint) { return Value(Storage(UndefinedData{std::move(hint)})); }
  static Value none() { return Value(Storage(nullptr)); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(size_t i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(ArrayPtr a) : v_(std::move(a)) {}
  Value(ObjectPtr o) : v_(std::move(o)) {}
  Value(CallablePtr c) : v_(std::move(c)) {}

  static Value array(std::vector<Value> items = {}, bool is_tuple = false);
  static Value object();
  static Value function(std::string name, NativeFn fn);
  // Converts JSON input (messages, tools, extra context) into template values.
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_array() const { return kind() == Kind::Array; }
  bool is_object() const { return kind() == Kind::Object; }
  bool is_namespace() const { return is_object() && obj()->is_namespace; }
  bool is_callable() const { return kind() == Kind::Callable; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Numeric value of an int, float or bool.
  double to_double() const;
  const std::string& str() const { return *std::get<StringPtr>(v_); }
  const ArrayPtr& arr() const { return std::get<ArrayPtr>(v_); }
  const ObjectPtr& obj() const { return std::get<ObjectPtr>(v_); }
  const CallablePtr& fn() const { return std::get<CallablePtr>(v_); }
  const std::string& undefined_hint() const { return std::get<UndefinedData>(v_).hint; }

  // Python truthiness.
  bool truthy() const;
  // Python str(): what {{ value }} prints.
  std::string to_string() const;
  // Python repr(): used for items inside printed lists and dicts.
  std::string repr() const;
  // Python type names, as used in error messages ("str", "int", "list", ...).
  const char* type_name() const;
  // transformers' tojson, i.e. Python's json.dumps with these settings.
  std::string to_json(const JsonFormat& format) const;
  nlohmann::ordered_json to_nlohmann(int depth = 0) const;

 private:
  // Strings are shared so that copying a value (every variable read) is O(1) even
  // for huge message contents.
  using StringPtr = std::shared_ptr<const std::string>;
  using Storage = std::variant<UndefinedData, std::nullptr_t, bool, int64_t, double, StringPtr,
                               ArrayPtr, ObjectPtr, CallablePtr>;
  explicit Value(Storage s) : v_(std::move(s)) {}
  Storage v_;
};

// Structured values may be cyclic or deep only through template mutation; every
// recursive walk stops at this depth with an error instead of exhausting the stack.
inline constexpr int kMaxValueDepth = 256;

bool values_equal(const Value& a, const Value& b, int depth = 0);
// Python ordering (<): numbers with numbers, strings, lists lexicographically;
// anything else is a render error.
bool value_less(const Value& a, const Value& b, int depth = 0);

}  // namespace deepinfer::jinja
