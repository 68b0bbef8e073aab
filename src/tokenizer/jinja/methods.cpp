// Attribute and item access, iteration, calls, and the Python methods of str,
// dict and list that chat templates use.
#include <algorithm>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/text_util.h"

namespace deepinfer::jinja {

namespace {

std::string object_desc(const Value& v) {
  return std::string(v.is_none() ? "None" : v.type_name()) + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_desc(obj) + "' has no attribute '" + name + "'");
}

Value method(const Value& self, const std::string& name, NativeFn fn) {
  (void)self;
  return Value::function(name, std::move(fn));
}

// Python str.split / rsplit.
Value split(RenderContext& ctx, const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<Value> parts;
  if (sep.is_none() || sep.is_undefined()) {
    auto cps = utf8_decode(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && is_py_space(cps[e - 1])) --e;
        parts.emplace_back(utf8_encode(cps, i, e));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      parts.emplace_back(utf8_encode(cps, i, j));
      i = j;
    }
  } else {
    DI_CHECK(sep.is_string(), "must be str or None, not {}", sep.type_name());
    const std::string& d = sep.str();
    DI_CHECK(!d.empty(), "empty separator");
    size_t start = 0;
    while (true) {
      size_t p = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) ? std::string::npos : s.find(d, start);
      if (p == std::string::npos) {
        parts.emplace_back(s.substr(start));
        break;
      }
      parts.emplace_back(s.substr(start, p - start));
      start = p + d.size();
    }
  }
  ctx.check_size(parts.size());
  return Value::array(std::move(parts));
}

bool prefix_match(const std::string& s, const Value& arg, bool suffix) {
  auto one = [&](const Value& v) {
    DI_CHECK(v.is_string(), "{} first arg must be str or a tuple of str, not {}", suffix ? "endswith" : "startswith",
             v.type_name());
    const std::string& p = v.str();
    if (p.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - p.size(), p.size(), p) == 0 : s.compare(0, p.size(), p) == 0;
  };
  if (arg.is_array()) {
    for (const auto& v : arg.arr()->items) {
      if (one(v)) return true;
    }
    return false;
  }
  return one(arg);
}

std::string replace_all(RenderContext& ctx, const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    auto cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
      ctx.check_size(out.size());
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += to;
    start = p + from.size();
    ++done;
    ctx.check_size(out.size());
  }
  out.append(s, start, std::string::npos);
  ctx.check_size(out.size());
  return out;
}

int64_t count_occurrences(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

// Python's str.format with positional ({} / {0}) and keyword ({name}) fields;
// format specs are not supported.
std::string str_format(RenderContext& ctx, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      size_t close = fmt.find('}', i);
      DI_CHECK(close != std::string::npos, "Single '{{' encountered in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      DI_CHECK(field.find(':') == std::string::npos && field.find('!') == std::string::npos,
               "format specs are not supported in chat templates: '{}'", field);
      const Value* v = nullptr;
      if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
        size_t idx = auto_index;
        if (field.empty()) {
          ++auto_index;
        } else {
          // Nine digits cannot overflow stoul; a longer index is out of range anyway.
          DI_CHECK(field.size() <= 9, "Replacement index {} out of range for positional args tuple", field);
          idx = static_cast<size_t>(std::stoul(field));
        }
        DI_CHECK(idx < args.positional.size(), "Replacement index {} out of range for positional args tuple", idx);
        v = &args.positional[idx];
      } else {
        for (const auto& [k, val] : args.keyword) {
          if (k == field) v = &val;
        }
        DI_CHECK(v, "KeyError: '{}'", field);
      }
      out += v->to_string();
      i = close;
    } else {
      out.push_back(c);
    }
    ctx.check_size(out.size());
  }
  return out;
}

Value string_method(const Value& self, const std::string& name) {
  const std::string s = self.str();
  auto strip_fn = [s, name](bool left, bool right) {
    return [s, name, left, right](RenderContext&, CallArgs& a) {
      ArgBinder b(name.c_str(), a, {"chars"});
      if (!b.has(0) || b.get(0).is_none()) return Value(py_strip(s, nullptr, left, right));
      return Value(py_strip(s, &b.get_str(0), left, right));
    };
  };
  if (name == "strip") return method(self, name, strip_fn(true, true));
  if (name == "lstrip") return method(self, name, strip_fn(true, false));
  if (name == "rstrip") return method(self, name, strip_fn(false, true));
  if (name == "upper") return method(self, name, [s](RenderContext&, CallArgs&) { return Value(py_upper(s)); });
  if (name == "lower") return method(self, name, [s](RenderContext&, CallArgs&) { return Value(py_lower(s)); });
  if (name == "title") return method(self, name, [s](RenderContext&, CallArgs&) { return Value(py_title(s)); });
  if (name == "capitalize") {
    return method(self, name, [s](RenderContext&, CallArgs&) { return Value(py_capitalize(s)); });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return method(self, name, [s, right](RenderContext& ctx, CallArgs& a) {
      ArgBinder b(right ? "rsplit" : "split", a, {"sep", "maxsplit"});
      int64_t maxsplit = b.get_int(1, -1);
      if (!right || maxsplit < 0) return split(ctx, s, b.get(0), maxsplit);
      // rsplit with a limit: split everything, then re-join the leading surplus.
      Value all = split(ctx, s, b.get(0), -1);
      auto& items = all.arr()->items;
      if (static_cast<int64_t>(items.size()) <= maxsplit + 1) return all;
      DI_CHECK(b.has(0) && !b.get(0).is_none(), "rsplit with maxsplit and no separator is not supported");
      size_t head = items.size() - static_cast<size_t>(maxsplit);
      std::string joined;
      for (size_t i = 0; i < head; ++i) joined += (i ? b.get(0).str() : "") + items[i].str();
      std::vector<Value> out{Value(joined)};
      out.insert(out.end(), items.begin() + static_cast<long>(head), items.end());
      return Value::array(std::move(out));
    });
  }
  if (name == "splitlines") {
    return method(self, name, [s](RenderContext& ctx, CallArgs&) {
      std::vector<Value> lines;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          lines.emplace_back(s.substr(start, i - start));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < s.size()) lines.emplace_back(s.substr(start));
      ctx.check_size(lines.size());
      return Value::array(std::move(lines));
    });
  }
  if (name == "startswith" || name == "endswith") {
    bool suffix = name == "endswith";
    return method(self, name, [s, suffix](RenderContext&, CallArgs& a) {
      ArgBinder b(suffix ? "endswith" : "startswith", a, {"prefix"});
      return Value(prefix_match(s, b.get(0), suffix));
    });
  }
  if (name == "replace") {
    return method(self, name, [s](RenderContext& ctx, CallArgs& a) {
      ArgBinder b("replace", a, {"old", "new", "count"});
      return Value(replace_all(ctx, s, b.get_str(0), b.get_str(1), b.get_int(2, -1)));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    bool right = name[0] == 'r';
    bool raises = name.find("index") != std::string::npos;
    return method(self, name, [s, right, raises](RenderContext&, CallArgs& a) {
      ArgBinder b("find", a, {"sub"});
      const std::string& sub = b.get_str(0);
      size_t p = right ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        DI_CHECK(!raises, "substring not found");
        return Value(static_cast<int64_t>(-1));
      }
      return Value(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p))));
    });
  }
  if (name == "count") {
    return method(self, name, [s](RenderContext&, CallArgs& a) {
      ArgBinder b("count", a, {"sub"});
      return Value(count_occurrences(s, b.get_str(0)));
    });
  }
  if (name == "join") {
    return method(self, name, [s](RenderContext& ctx, CallArgs& a) {
      ArgBinder b("join", a, {"iterable"});
      std::string out;
      bool first = true;
      for (const auto& v : iterate(b.get(0))) {
        DI_CHECK(v.is_string(), "sequence item: expected str instance, {} found", v.type_name());
        if (!first) out += s;
        first = false;
        out += v.str();
        ctx.check_size(out.size());
      }
      return Value(std::move(out));
    });
  }
  if (name == "format") {
    return method(self, name, [s](RenderContext& ctx, CallArgs& a) { return Value(str_format(ctx, s, a)); });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    bool suffix = name == "removesuffix";
    return method(self, name, [s, suffix](RenderContext&, CallArgs& a) {
      ArgBinder b(suffix ? "removesuffix" : "removeprefix", a, {"affix"});
      const std::string& p = b.get_str(0);
      if (!prefix_match(s, Value(p), suffix)) return Value(s);
      return Value(suffix ? s.substr(0, s.size() - p.size()) : s.substr(p.size()));
    });
  }
  auto predicate = [&](auto pred) {
    return method(self, name, [s, pred](RenderContext&, CallArgs&) {
      auto cps = utf8_decode(s);
      if (cps.empty()) return Value(false);
      for (char32_t c : cps) {
        if (!pred(c)) return Value(false);
      }
      return Value(true);
    });
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") {
    return predicate([](char32_t c) { return c >= '0' && c <= '9'; });
  }
  if (name == "isspace") return predicate([](char32_t c) { return is_py_space(c); });
  if (name == "isalpha") {
    return predicate([](char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; });
  }
  if (name == "isalnum") {
    return predicate([](char32_t c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
    });
  }
  if (name == "islower") return method(self, name, [s](RenderContext&, CallArgs&) {
    return Value(py_lower(s) == s && py_upper(s) != s);
  });
  if (name == "isupper") return method(self, name, [s](RenderContext&, CallArgs&) {
    return Value(py_upper(s) == s && py_lower(s) != s);
  });
  return missing_attr(self, name);
}

Value dict_method(const Value& self, const std::string& name) {
  ObjectPtr o = self.obj();
  if (name == "items") {
    return method(self, name, [o](RenderContext&, CallArgs&) {
      std::vector<Value> items;
      for (const auto& [k, v] : o->entries) items.push_back(Value::array({Value(k), v}, true));
      return Value::array(std::move(items));
    });
  }
  if (name == "keys") {
    return method(self, name, [o](RenderContext&, CallArgs&) {
      std::vector<Value> items;
      for (const auto& [k, v] : o->entries) items.emplace_back(k);
      return Value::array(std::move(items));
    });
  }
  if (name == "values") {
    return method(self, name, [o](RenderContext&, CallArgs&) {
      std::vector<Value> items;
      for (const auto& [k, v] : o->entries) items.push_back(v);
      return Value::array(std::move(items));
    });
  }
  if (name == "get") {
    return method(self, name, [o](RenderContext&, CallArgs& a) {
      ArgBinder b("get", a, {"key", "default"});
      if (b.get(0).is_string()) {
        if (const Value* v = o->find(b.get(0).str())) return *v;
      }
      return b.has(1) ? b.get(1) : Value::none();
    });
  }
  return Value();
}

Value list_method(const Value& self, const std::string& name) {
  Value list = self;
  if (name == "append") {
    return method(self, name, [list](RenderContext& ctx, CallArgs& a) {
      ArgBinder b("append", a, {"object"});
      ctx.check_size(list.arr()->items.size() + 1);
      list.arr()->items.push_back(b.get(0));
      ctx.note_mutation(list);
      return Value::none();
    });
  }
  if (name == "extend") {
    return method(self, name, [list](RenderContext& ctx, CallArgs& a) {
      ArgBinder b("extend", a, {"iterable"});
      auto items = iterate(b.get(0));
      ctx.check_size(list.arr()->items.size() + items.size());
      list.arr()->items.insert(list.arr()->items.end(), items.begin(), items.end());
      ctx.note_mutation(list);
      return Value::none();
    });
  }
  if (name == "pop") {
    return method(self, name, [list](RenderContext&, CallArgs& a) {
      ArgBinder b("pop", a, {"index"});
      auto& items = list.arr()->items;
      DI_CHECK(!items.empty(), "pop from empty list");
      int64_t i = b.get_int(0, -1);
      if (i < 0) i += static_cast<int64_t>(items.size());
      DI_CHECK(i >= 0 && i < static_cast<int64_t>(items.size()), "pop index out of range");
      Value v = items[static_cast<size_t>(i)];
      items.erase(items.begin() + i);
      return v;
    });
  }
  if (name == "index" || name == "count") {
    bool is_index = name == "index";
    return method(self, name, [list, is_index](RenderContext&, CallArgs& a) {
      ArgBinder b(is_index ? "index" : "count", a, {"value"});
      const auto& items = list.arr()->items;
      int64_t n = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!values_equal(items[i], b.get(0))) continue;
        if (is_index) return Value(i);
        ++n;
      }
      DI_CHECK(!is_index, "{} is not in list", b.get(0).repr());
      return Value(n);
    });
  }
  return Value();
}

int64_t normalize_index(int64_t i, size_t size) { return i < 0 ? i + static_cast<int64_t>(size) : i; }

}  // namespace

[[noreturn]] void fail_undefined(const Value& v) {
  fail("{}", v.undefined_hint().empty() ? std::string("value is undefined") : v.undefined_hint());
}

Value get_attr(RenderContext& ctx, const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: fail_undefined(obj);
    case Value::Kind::Object: {
      if (obj.is_namespace()) {
        const Value* v = obj.obj()->find(name);
        return v ? *v : missing_attr(obj, name);
      }
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      const Value* v = obj.obj()->find(name);
      return v ? *v : missing_attr(obj, name);
    }
    case Value::Kind::String: return string_method(obj, name);
    case Value::Kind::Array: {
      Value m = obj.arr()->is_tuple ? Value() : list_method(obj, name);
      return m.is_undefined() ? missing_attr(obj, name) : m;
    }
    default: return missing_attr(obj, name);
  }
}

Value get_item(RenderContext& ctx, const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_object() && !obj.is_namespace()) {
    if (key.is_string()) {
      if (const Value* v = obj.obj()->find(key.str())) return *v;
      return get_attr(ctx, obj, key.str());
    }
    return Value::undefined("'dict object' has no attribute " + key.repr());
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t k = key.is_bool() ? key.as_bool() : key.as_int();
    if (obj.is_array()) {
      const auto& items = obj.arr()->items;
      int64_t i = normalize_index(k, items.size());
      if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
    } else if (is_ascii(obj.str())) {
      int64_t i = normalize_index(k, obj.str().size());
      if (i >= 0 && i < static_cast<int64_t>(obj.str().size())) return Value(std::string(1, obj.str()[static_cast<size_t>(i)]));
    } else {
      auto cps = utf8_decode(obj.str());
      int64_t i = normalize_index(k, cps.size());
      if (i >= 0 && i < static_cast<int64_t>(cps.size())) return Value(utf8_encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
    }
    return Value::undefined("'" + object_desc(obj) + "' has no attribute " + key.repr());
  }
  if (key.is_string()) return get_attr(ctx, obj, key.str());
  return Value::undefined("'" + object_desc(obj) + "' has no attribute " + key.repr());
}

Value get_slice(RenderContext& ctx, const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    DI_CHECK(v.is_int() || v.is_bool(), "slice {} must be an integer or None, not {}", what, v.type_name());
    return v.is_bool() ? v.as_bool() : v.as_int();
  };
  auto st = as_index(step, "step");
  int64_t k = st.value_or(1);
  DI_CHECK(k != 0, "slice step cannot be zero");
  std::vector<char32_t> cps;
  size_t n;
  if (obj.is_string()) {
    cps = utf8_decode(obj.str());
    n = cps.size();
  } else {
    DI_CHECK(obj.is_array(), "'{}' object is not subscriptable", obj.type_name());
    n = obj.arr()->items.size();
  }
  const int64_t len = static_cast<int64_t>(n);
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v < 0 ? *v + len : *v;
    if (k > 0) return std::clamp<int64_t>(i, 0, len);
    return std::clamp<int64_t>(i, -1, len - 1);
  };
  int64_t b = clamp(as_index(start, "start"), k > 0 ? 0 : len - 1);
  int64_t e = clamp(as_index(stop, "stop"), k > 0 ? len : -1);
  std::vector<size_t> picks;
  for (int64_t i = b; k > 0 ? i < e : i > e; i += k) picks.push_back(static_cast<size_t>(i));
  ctx.check_size(picks.size());
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picks) {
      if (cps[i] >= 0xDC80 && cps[i] < 0xDD00) out.push_back(static_cast<char>(cps[i] - 0xDC00));
      else utf8_append(out, cps[i]);
    }
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (size_t i : picks) out.push_back(obj.arr()->items[i]);
  return Value::array(std::move(out), obj.arr()->is_tuple);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      DI_CHECK(item.is_string(), "'in <string>' requires string as left operand, not {}", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::Array:
      for (const auto& v : container.arr()->items) {
        if (values_equal(v, item)) return true;
      }
      return false;
    case Value::Kind::Object:
      DI_CHECK(!container.is_namespace(), "argument of type 'Namespace' is not iterable");
      return item.is_string() && container.obj()->find(item.str()) != nullptr;
    default: fail("argument of type '{}' is not iterable", container.type_name());
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::Array: return v.arr()->items;
    case Value::Kind::Object: {
      DI_CHECK(!v.is_namespace(), "'Namespace' object is not iterable");
      std::vector<Value> keys;
      for (const auto& [k, x] : v.obj()->entries) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      auto cps = utf8_decode(v.str());
      for (size_t i = 0; i < cps.size(); ++i) chars.emplace_back(utf8_encode(cps, i, i + 1));
      return chars;
    }
    default: fail("'{}' object is not iterable", v.type_name());
  }
}

size_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return utf8_length(v.str());
    case Value::Kind::Array: return v.arr()->items.size();
    case Value::Kind::Object:
      DI_CHECK(!v.is_namespace(), "object of type 'Namespace' has no len()");
      return v.obj()->entries.size();
    default: fail("object of type '{}' has no len()", v.type_name());
  }
}

Value call_value(RenderContext& ctx, const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  DI_CHECK(callee.is_callable(), "'{}' object is not callable", callee.type_name());
  return callee.fn()->fn(ctx, args);
}

ArgBinder::ArgBinder(const char* function, CallArgs& args, std::vector<const char*> names)
    : function_(function), names_(std::move(names)), values_(names_.size()) {
  DI_CHECK(args.positional.size() <= names_.size(), "{}() takes at most {} argument(s) ({} given)", function_,
           names_.size(), args.positional.size());
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = args.positional[i];
  for (auto& [k, v] : args.keyword) {
    size_t i = 0;
    while (i < names_.size() && k != names_[i]) ++i;
    DI_CHECK(i < names_.size(), "{}() got an unexpected keyword argument '{}'", function_, k);
    values_[i] = v;
  }
}

int64_t ArgBinder::get_int(size_t i, int64_t fallback) const {
  if (!has(i) || values_[i].is_none()) return fallback;
  DI_CHECK(values_[i].is_int() || values_[i].is_bool(), "{}(): argument '{}' must be an integer, not {}", function_,
           names_[i], values_[i].type_name());
  return values_[i].is_bool() ? values_[i].as_bool() : values_[i].as_int();
}

bool ArgBinder::get_bool(size_t i, bool fallback) const { return has(i) ? values_[i].truthy() : fallback; }

const std::string& ArgBinder::get_str(size_t i) const {
  DI_CHECK(has(i), "{}() missing required argument '{}'", function_, names_[i]);
  DI_CHECK(values_[i].is_string(), "{}(): argument '{}' must be str, not {}", function_, names_[i],
           values_[i].type_name());
  return values_[i].str();
}

}  // namespace deepinfer::jinja
