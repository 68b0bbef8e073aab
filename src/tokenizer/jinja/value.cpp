#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/jinja/text_util.h"

namespace deepinfer::jinja {

namespace {

void check_depth(int depth) {
  DI_CHECK(depth <= kMaxValueDepth, "value nested deeper than {} levels (or cyclic)",
           kMaxValueDepth);
}

// Containers are torn down iteratively: a deeply nested value built by a template
// would otherwise recurse once per level in the destructors and overflow the stack.
struct PendingDestroy {
  std::vector<ArrayPtr> arrays;
  std::vector<ObjectPtr> objects;

  void take(Value& v) {
    if (v.is_array() && v.arr().use_count() == 1) {
      arrays.push_back(v.arr());
      v = Value::none();
    } else if (v.is_object() && v.obj().use_count() == 1) {
      objects.push_back(v.obj());
      v = Value::none();
    }
  }
  void drain() {
    while (!arrays.empty() || !objects.empty()) {
      if (!arrays.empty()) {
        ArrayPtr a = std::move(arrays.back());
        arrays.pop_back();
        for (auto& item : a->items) take(item);
      } else {
        ObjectPtr o = std::move(objects.back());
        objects.pop_back();
        for (auto& [k, item] : o->entries) take(item);
      }
    }
  }
};

}  // namespace

ArrayData::~ArrayData() {
  PendingDestroy p;
  for (auto& item : items) p.take(item);
  p.drain();
}

ObjectData::~ObjectData() {
  PendingDestroy p;
  for (auto& [k, item] : entries) p.take(item);
  p.drain();
}

const Value* ObjectData::find(const std::string& key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

void ObjectData::set(const std::string& key, Value value) {
  auto it = index.find(key);
  if (it != index.end()) {
    entries[it->second].second = std::move(value);
  } else {
    index.emplace(key, entries.size());
    entries.emplace_back(key, std::move(value));
  }
}

Value Value::array(std::vector<Value> items, bool is_tuple) {
  auto a = std::make_shared<ArrayData>();
  a->items = std::move(items);
  a->is_tuple = is_tuple;
  return Value(std::move(a));
}

Value Value::object() { return Value(std::make_shared<ObjectData>()); }

Value Value::function(std::string name, NativeFn fn) {
  return Value(std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)}));
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  check_depth(depth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return array(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value o = object();
      for (auto it = j.begin(); it != j.end(); ++it) o.obj()->set(it.key(), from_json(it.value(), depth + 1));
      return o;
    }
    default: fail("unsupported JSON value (binary or discarded)");
  }
}

double Value::to_double() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return as_float();
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return as_bool();
    case Kind::Int: return as_int() != 0;
    case Kind::Float: return as_float() != 0.0;
    case Kind::String: return !str().empty();
    case Kind::Array: return !arr()->items.empty();
    case Kind::Object: return is_namespace() || !obj()->entries.empty();
    case Kind::Callable: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Array: return arr()->is_tuple ? "tuple" : "list";
    case Kind::Object: return is_namespace() ? "Namespace" : "dict";
    case Kind::Callable: return "function";
  }
  return "?";
}

namespace {

void repr_into(const Value& v, std::string& out, int depth);

void container_repr(const Value& v, std::string& out, int depth) {
  check_depth(depth);
  if (v.is_array()) {
    bool tuple = v.arr()->is_tuple;
    out.push_back(tuple ? '(' : '[');
    const auto& items = v.arr()->items;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ", ";
      repr_into(items[i], out, depth + 1);
    }
    if (tuple && items.size() == 1) out.push_back(',');
    out.push_back(tuple ? ')' : ']');
    return;
  }
  if (v.is_namespace()) {
    out += "<Namespace ";
    out.push_back('{');
  } else {
    out.push_back('{');
  }
  bool first = true;
  for (const auto& [k, item] : v.obj()->entries) {
    if (!first) out += ", ";
    first = false;
    out += py_str_repr(k);
    out += ": ";
    repr_into(item, out, depth + 1);
  }
  out.push_back('}');
  if (v.is_namespace()) out.push_back('>');
}

void repr_into(const Value& v, std::string& out, int depth) {
  if (v.is_string()) {
    out += py_str_repr(v.str());
  } else if (v.is_array() || v.is_object()) {
    container_repr(v, out, depth);
  } else {
    out += v.to_string();
  }
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  if (!ensure_ascii || is_ascii(s)) {
    json_quote(out, s);
    return;
  }
  out.push_back('"');
  auto hex = [&](unsigned u) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u%04x", u);
    out += buf;
  };
  for (char32_t c : utf8_decode(s)) {
    if (c < 0x80) {
      std::string one;
      json_quote(one, std::string(1, static_cast<char>(c)));
      out.append(one, 1, one.size() - 2);
    } else if (c >= 0x10000) {
      hex(0xD800 + ((c - 0x10000) >> 10));
      hex(0xDC00 + ((c - 0x10000) & 0x3FF));
    } else {
      hex(c);
    }
  }
  out.push_back('"');
}

void json_into(const Value& v, std::string& out, const JsonFormat& f, int depth) {
  check_depth(depth);
  bool has_indent = f.has_indent;
  auto newline = [&](int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += f.indent;
  };
  switch (v.kind()) {
    case Value::Kind::Undefined: fail("Object of type Undefined is not JSON serializable");
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      double d = v.as_float();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(d);
      return;
    }
    case Value::Kind::String: json_string(out, v.str(), f.ensure_ascii); return;
    case Value::Kind::Callable: fail("Object of type function is not JSON serializable");
    case Value::Kind::Array: {
      const auto& items = v.arr()->items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += f.item_separator;
        if (has_indent) newline(depth + 1);
        json_into(items[i], out, f, depth + 1);
      }
      if (has_indent) newline(depth);
      out.push_back(']');
      return;
    }
    case Value::Kind::Object: {
      DI_CHECK(!v.is_namespace(), "Object of type Namespace is not JSON serializable");
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.obj()->entries) entries.push_back(&e);
      if (f.sort_keys) {
        std::sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += f.item_separator;
        if (has_indent) newline(depth + 1);
        json_string(out, entries[i]->first, f.ensure_ascii);
        out += f.key_separator;
        json_into(entries[i]->second, out, f, depth + 1);
      }
      if (has_indent) newline(depth);
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

std::string Value::to_string() const {
  switch (kind()) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return as_bool() ? "True" : "False";
    case Kind::Int: return std::to_string(as_int());
    case Kind::Float: return py_float_repr(as_float());
    case Kind::String: return str();
    case Kind::Array:
    case Kind::Object: {
      std::string out;
      container_repr(*this, out, 0);
      return out;
    }
    case Kind::Callable: return "<function " + fn()->name + ">";
  }
  return "";
}

std::string Value::repr() const {
  std::string out;
  repr_into(*this, out, 0);
  return out;
}

std::string Value::to_json(const JsonFormat& format) const {
  std::string out;
  json_into(*this, out, format, 0);
  return out;
}

nlohmann::ordered_json Value::to_nlohmann(int depth) const {
  check_depth(depth);
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None: return nullptr;
    case Kind::Bool: return as_bool();
    case Kind::Int: return as_int();
    case Kind::Float: return as_float();
    case Kind::String: return str();
    case Kind::Array: {
      auto j = nlohmann::ordered_json::array();
      for (const auto& e : arr()->items) j.push_back(e.to_nlohmann(depth + 1));
      return j;
    }
    case Kind::Object: {
      auto j = nlohmann::ordered_json::object();
      for (const auto& [k, e] : obj()->entries) j[k] = e.to_nlohmann(depth + 1);
      return j;
    }
    case Kind::Callable: return to_string();
  }
  return nullptr;
}

bool values_equal(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() || a.is_bool()) {
    if (!(b.is_number() || b.is_bool())) return false;
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    auto ai = a.is_bool() ? static_cast<int64_t>(a.as_bool()) : a.as_int();
    auto bi = b.is_bool() ? static_cast<int64_t>(b.as_bool()) : b.as_int();
    return ai == bi;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.str() == b.str();
    case Value::Kind::Array: {
      const auto& x = a.arr()->items;
      const auto& y = b.arr()->items;
      if (a.arr() == b.arr()) return true;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!values_equal(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::Object: {
      if (a.obj() == b.obj()) return true;
      if (a.is_namespace() || b.is_namespace()) return false;
      const auto& x = a.obj()->entries;
      if (x.size() != b.obj()->entries.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = b.obj()->find(k);
        if (!other || !values_equal(v, *other, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::Callable: return a.fn() == b.fn();
    default: return false;
  }
}

bool value_less(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int();
    return a.to_double() < b.to_double();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_array() && b.is_array()) {
    const auto& x = a.arr()->items;
    const auto& y = b.arr()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i], depth + 1)) return value_less(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

}  // namespace deepinfer::jinja
