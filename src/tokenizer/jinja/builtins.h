// Filters, tests, attribute/item access and Python methods of built-in types.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/jinja/render_context.h"
#include "tokenizer/jinja/value.h"

namespace deepinfer::jinja {

Value apply_filter(RenderContext& ctx, const std::string& name, const Value& input, CallArgs& args);
bool apply_test(RenderContext& ctx, const std::string& name, const Value& input, std::vector<Value>& args);
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

// obj.name: dict keys, namespace attributes and bound methods; missing gives Undefined.
Value get_attr(RenderContext& ctx, const Value& obj, const std::string& name);
// obj[key]
Value get_item(RenderContext& ctx, const Value& obj, const Value& key);
// obj[start:stop:step]; absent bounds are Undefined.
Value get_slice(RenderContext& ctx, const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python `item in container`.
bool contains(const Value& container, const Value& item);
// The values a for loop visits (dict keys, string characters, list items).
std::vector<Value> iterate(const Value& v);
// Python len().
size_t py_len(const Value& v);
// Throws the error Jinja raises when an Undefined value is used.
[[noreturn]] void fail_undefined(const Value& v);
Value call_value(RenderContext& ctx, const Value& callee, CallArgs& args);

// Binds Python-style call arguments to parameter names.
class ArgBinder {
 public:
  ArgBinder(const char* function, CallArgs& args, std::vector<const char*> names);
  bool has(size_t i) const { return !values_[i].is_undefined(); }
  const Value& get(size_t i) const { return values_[i]; }
  const Value& get_or(size_t i, const Value& fallback) const { return has(i) ? values_[i] : fallback; }
  int64_t get_int(size_t i, int64_t fallback) const;
  bool get_bool(size_t i, bool fallback) const;
  const std::string& get_str(size_t i) const;

 private:
  const char* function_;
  std::vector<const char*> names_;
  std::vector<Value> values_;
};

}  // namespace deepinfer::jinja
