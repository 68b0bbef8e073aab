// Jinja's built-in filters and tests (the subset chat templates use), with
// transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/text_util.h"

namespace deepinfer::jinja {

namespace {

using FilterFn = std::function<Value(RenderContext&, const Value&, CallArgs&)>;
using TestFn = std::function<bool(RenderContext&, const Value&, std::vector<Value>&)>;

// Jinja's soft_str: filters that work on text accept any value.
std::string text_of(const Value& v) { return v.to_string(); }

// Follows a dotted attribute path ("function.name", "0.x") as Jinja's attribute= arguments do.
Value attribute_path(RenderContext& ctx, const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) && part.size() < 18;
    cur = get_item(ctx, cur, digits ? Value(static_cast<int64_t>(std::atoll(part.c_str()))) : Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value list_value(std::vector<Value> items) { return Value::array(std::move(items)); }

// Implements select/reject/selectattr/rejectattr.
Value select_items(RenderContext& ctx, const Value& input, CallArgs& args, bool with_attr, bool keep_if) {
  std::vector<Value> rest = args.positional;
  DI_CHECK(args.keyword.empty(), "select filters take no keyword arguments");
  std::string attr;
  if (with_attr) {
    DI_CHECK(!rest.empty() && rest[0].is_string(), "selectattr/rejectattr need an attribute name");
    attr = rest[0].str();
    rest.erase(rest.begin());
  }
  std::string test;
  if (!rest.empty()) {
    DI_CHECK(rest[0].is_string(), "the test name must be a string");
    test = rest[0].str();
    rest.erase(rest.begin());
  }
  std::vector<Value> out;
  for (const auto& item : iterate(input)) {
    ctx.count_iteration();
    Value subject = with_attr ? attribute_path(ctx, item, attr) : item;
    std::vector<Value> test_args = rest;
    bool ok = test.empty() ? subject.truthy() : apply_test(ctx, test, subject, test_args);
    if (ok == keep_if) out.push_back(item);
  }
  return list_value(std::move(out));
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py_lower(v.str()));
  return v;
}

std::string do_indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::vector<std::string> lines;
  size_t start = 0;
  std::string text = s + "\n";
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      lines.push_back(text.substr(start, i - start));
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == 0) {
      rv = lines[0];
      continue;
    }
    rv += "\n";
    if (blank || !lines[i].empty()) rv += pad;
    rv += lines[i];
  }
  if (first) rv = pad + rv;
  return rv;
}

double round_half_even(double v) { return std::nearbyint(v); }

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = [] {
    std::unordered_map<std::string, FilterFn> f;
    auto identity = [](RenderContext&, const Value& v, CallArgs&) { return v; };
    f["safe"] = identity;
    f["string"] = [](RenderContext&, const Value& v, CallArgs&) { return Value(text_of(v)); };
    f["e"] = f["escape"] = f["forceescape"] = [](RenderContext& ctx, const Value& v, CallArgs&) {
      std::string out;
      for (char c : text_of(v)) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out.push_back(c);
        }
      }
      ctx.check_size(out.size());
      return Value(std::move(out));
    };
    f["length"] = f["count"] = [](RenderContext&, const Value& v, CallArgs&) { return Value(py_len(v)); };
    f["lower"] = [](RenderContext&, const Value& v, CallArgs&) { return Value(py_lower(text_of(v))); };
    f["upper"] = [](RenderContext&, const Value& v, CallArgs&) { return Value(py_upper(text_of(v))); };
    f["title"] = [](RenderContext&, const Value& v, CallArgs&) { return Value(py_title(text_of(v))); };
    f["capitalize"] = [](RenderContext&, const Value& v, CallArgs&) { return Value(py_capitalize(text_of(v))); };
    f["trim"] = [](RenderContext&, const Value& v, CallArgs& a) {
      ArgBinder b("trim", a, {"chars"});
      std::string s = text_of(v);
      if (!b.has(0) || b.get(0).is_none()) return Value(py_strip(s, nullptr, true, true));
      return Value(py_strip(s, &b.get_str(0), true, true));
    };
    f["replace"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      CallArgs bound = a;
      Value method = get_attr(ctx, Value(text_of(v)), "replace");
      return call_value(ctx, method, bound);
    };
    f["join"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      ArgBinder b("join", a, {"d", "attribute"});
      std::string sep = b.has(0) ? text_of(b.get(0)) : "";
      std::string out;
      bool first = true;
      for (const auto& item : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += text_of(b.has(1) ? attribute_path(ctx, item, text_of(b.get(1))) : item);
        ctx.check_size(out.size());
      }
      return Value(std::move(out));
    };
    f["default"] = f["d"] = [](RenderContext&, const Value& v, CallArgs& a) {
      ArgBinder b("default", a, {"default_value", "boolean"});
      bool use_default = v.is_undefined() || (b.get_bool(1, false) && !v.truthy());
      return use_default ? b.get_or(0, Value("")) : v;
    };
    f["first"] = [](RenderContext&, const Value& v, CallArgs&) {
      auto items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    f["last"] = [](RenderContext&, const Value& v, CallArgs&) {
      auto items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    f["list"] = [](RenderContext&, const Value& v, CallArgs&) { return list_value(iterate(v)); };
    f["reverse"] = [](RenderContext&, const Value& v, CallArgs&) {
      if (v.is_string()) {
        auto cps = utf8_decode(v.str());
        std::reverse(cps.begin(), cps.end());
        return Value(utf8_encode(cps, 0, cps.size()));
      }
      auto items = iterate(v);
      std::reverse(items.begin(), items.end());
      return list_value(std::move(items));
    };
    f["items"] = [](RenderContext&, const Value& v, CallArgs&) {
      if (v.is_undefined()) return list_value({});
      DI_CHECK(v.is_object() && !v.is_namespace(), "Can only get item pairs from a mapping.");
      std::vector<Value> out;
      for (const auto& [k, x] : v.obj()->entries) out.push_back(Value::array({Value(k), x}, true));
      return list_value(std::move(out));
    };
    f["dictsort"] = [](RenderContext&, const Value& v, CallArgs& a) {
      ArgBinder b("dictsort", a, {"case_sensitive", "by", "reverse"});
      DI_CHECK(v.is_object() && !v.is_namespace(), "You can only sort by either \"key\" or \"value\"");
      bool by_value = b.has(1) && b.get(1).is_string() && b.get(1).str() == "value";
      bool cs = b.get_bool(0, false);
      std::vector<Value> out;
      for (const auto& [k, x] : v.obj()->entries) out.push_back(Value::array({Value(k), x}, true));
      std::stable_sort(out.begin(), out.end(), [&](const Value& l, const Value& r) {
        size_t i = by_value ? 1 : 0;
        return value_less(sort_key(l.arr()->items[i], cs), sort_key(r.arr()->items[i], cs));
      });
      if (b.get_bool(2, false)) std::reverse(out.begin(), out.end());
      return list_value(std::move(out));
    };
    f["map"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      std::vector<Value> out;
      const Value* attribute = nullptr;
      const Value* fallback = nullptr;
      for (const auto& [k, x] : a.keyword) {
        if (k == "attribute") attribute = &x;
        else if (k == "default") fallback = &x;
        else DI_CHECK(false, "map() got an unexpected keyword argument '{}'", k);
      }
      for (const auto& item : iterate(v)) {
        ctx.count_iteration();
        if (attribute) {
          Value r = attribute_path(ctx, item, text_of(*attribute));
          out.push_back(r.is_undefined() && fallback ? *fallback : r);
        } else {
          DI_CHECK(!a.positional.empty() && a.positional[0].is_string(), "map() requires a filter name or attribute=");
          CallArgs rest;
          rest.positional.assign(a.positional.begin() + 1, a.positional.end());
          out.push_back(apply_filter(ctx, a.positional[0].str(), item, rest));
        }
      }
      return list_value(std::move(out));
    };
    f["select"] = [](RenderContext& c, const Value& v, CallArgs& a) { return select_items(c, v, a, false, true); };
    f["reject"] = [](RenderContext& c, const Value& v, CallArgs& a) { return select_items(c, v, a, false, false); };
    f["selectattr"] = [](RenderContext& c, const Value& v, CallArgs& a) { return select_items(c, v, a, true, true); };
    f["rejectattr"] = [](RenderContext& c, const Value& v, CallArgs& a) { return select_items(c, v, a, true, false); };
    f["tojson"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      ArgBinder b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
      JsonFormat fmt;
      fmt.ensure_ascii = b.get_bool(0, false);
      if (b.has(1) && !b.get(1).is_none()) {
        fmt.has_indent = true;
        fmt.item_separator = ",";
        if (b.get(1).is_string()) fmt.indent = b.get(1).str();
        else fmt.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(b.get_int(1, 0), 0, 64)), ' ');
      }
      if (b.has(2) && !b.get(2).is_none()) {
        auto seps = iterate(b.get(2));
        DI_CHECK(seps.size() == 2 && seps[0].is_string() && seps[1].is_string(), "tojson separators must be two strings");
        fmt.item_separator = seps[0].str();
        fmt.key_separator = seps[1].str();
      }
      fmt.sort_keys = b.get_bool(3, false);
      std::string out = v.to_json(fmt);
      ctx.check_size(out.size());
      return Value(std::move(out));
    };
    f["unique"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      ArgBinder b("unique", a, {"case_sensitive", "attribute"});
      bool cs = b.get_bool(0, false);
      std::vector<Value> out, seen;
      for (const auto& item : iterate(v)) {
        ctx.count_iteration();
        Value key = sort_key(b.has(1) ? attribute_path(ctx, item, text_of(b.get(1))) : item, cs);
        bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); });
        if (dup) continue;
        seen.push_back(key);
        out.push_back(item);
      }
      return list_value(std::move(out));
    };
    f["sort"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      ArgBinder b("sort", a, {"reverse", "case_sensitive", "attribute"});
      bool cs = b.get_bool(1, false);
      auto items = iterate(v);
      std::vector<std::pair<Value, Value>> keyed;
      for (auto& item : items) {
        keyed.emplace_back(sort_key(b.has(2) ? attribute_path(ctx, item, text_of(b.get(2))) : item, cs), item);
      }
      bool rev = b.get_bool(0, false);
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& l, const auto& r) {
        return rev ? value_less(r.first, l.first) : value_less(l.first, r.first);
      });
      std::vector<Value> out;
      for (auto& [k, item] : keyed) out.push_back(item);
      return list_value(std::move(out));
    };
    f["int"] = [](RenderContext&, const Value& v, CallArgs& a) {
      ArgBinder b("int", a, {"default", "base"});
      Value dflt = b.get_or(0, Value(static_cast<int64_t>(0)));
      if (v.is_int()) return v;
      if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
      if (v.is_float()) {
        double d = v.as_float();
        if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
        return Value(static_cast<int64_t>(d));
      }
      if (v.is_string()) {
        std::string s = py_strip(v.str(), nullptr, true, true);
        char* end = nullptr;
        errno = 0;
        long long i = std::strtoll(s.c_str(), &end, static_cast<int>(b.get_int(1, 10)));
        if (!s.empty() && end && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(i));
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) {
          return Value(static_cast<int64_t>(d));
        }
      }
      return dflt;
    };
    f["float"] = [](RenderContext&, const Value& v, CallArgs& a) {
      ArgBinder b("float", a, {"default"});
      if (v.is_number() || v.is_bool()) return Value(v.to_double());
      if (v.is_string()) {
        std::string s = py_strip(v.str(), nullptr, true, true);
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value(d);
      }
      return b.get_or(0, Value(0.0));
    };
    f["abs"] = [](RenderContext&, const Value& v, CallArgs&) {
      if (v.is_float()) return Value(std::fabs(v.as_float()));
      DI_CHECK(v.is_int() || v.is_bool(), "bad operand type for abs(): '{}'", v.type_name());
      int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
      DI_CHECK(i != INT64_MIN, "integer overflow");
      return Value(i < 0 ? -i : i);
    };
    f["round"] = [](RenderContext&, const Value& v, CallArgs& a) {
      ArgBinder b("round", a, {"precision", "method"});
      int64_t precision = std::clamp<int64_t>(b.get_int(0, 0), -20, 20);
      std::string m = b.has(1) ? b.get_str(1) : "common";
      DI_CHECK(v.is_number() || v.is_bool(), "round() needs a number, not {}", v.type_name());
      if (m == "common" && !v.is_float()) return v;
      double scale = std::pow(10.0, static_cast<double>(precision));
      double x = v.to_double() * scale;
      double r = m == "common" ? round_half_even(x) : m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x)
                                                                                   : NAN;
      DI_CHECK(!std::isnan(r) || std::isnan(x), "method must be common, ceil or floor");
      return Value(r / scale);
    };
    f["indent"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      ArgBinder b("indent", a, {"width", "first", "blank"});
      std::string pad = b.has(0) && b.get(0).is_string()
                            ? b.get(0).str()
                            : std::string(static_cast<size_t>(std::clamp<int64_t>(b.get_int(0, 4), 0, 256)), ' ');
      std::string s = text_of(v);
      ctx.check_size(s.size() + (pad.size() + 1) * static_cast<size_t>(std::count(s.begin(), s.end(), '\n') + 1));
      return Value(do_indent(s, pad, b.get_bool(1, false), b.get_bool(2, false)));
    };
    f["wordcount"] = [](RenderContext&, const Value& v, CallArgs&) {
      // Jinja counts runs of regex \w (Unicode letters, numbers and '_').
      int64_t words = 0;
      bool in_word = false;
      for (char32_t c : utf8_decode(text_of(v))) {
        bool w = is_word_char(c);
        if (w && !in_word) ++words;
        in_word = w;
      }
      return Value(words);
    };
    f["batch"] = [](RenderContext&, const Value& v, CallArgs& a) {
      ArgBinder b("batch", a, {"linecount", "fill_with"});
      int64_t n = b.get_int(0, 1);
      DI_CHECK(n > 0, "batch size must be positive");
      std::vector<Value> out, cur;
      for (const auto& item : iterate(v)) {
        cur.push_back(item);
        if (static_cast<int64_t>(cur.size()) == n) {
          out.push_back(list_value(std::move(cur)));
          cur.clear();
        }
      }
      if (!cur.empty()) {
        if (b.has(1)) {
          while (static_cast<int64_t>(cur.size()) < n) cur.push_back(b.get(1));
        }
        out.push_back(list_value(std::move(cur)));
      }
      return list_value(std::move(out));
    };
    f["sum"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      ArgBinder b("sum", a, {"attribute", "start"});
      Value total = b.get_or(1, Value(static_cast<int64_t>(0)));
      for (const auto& item : iterate(v)) {
        Value x = b.has(0) ? attribute_path(ctx, item, text_of(b.get(0))) : item;
        total = binary_arith(ctx, BinaryOp::Add, total, x);
      }
      return total;
    };
    auto extreme = [](bool want_max) {
      return [want_max](RenderContext& ctx, const Value& v, CallArgs& a) {
        ArgBinder b(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
        bool cs = b.get_bool(0, false);
        Value best, best_key;
        for (const auto& item : iterate(v)) {
          Value key = sort_key(b.has(1) ? attribute_path(ctx, item, text_of(b.get(1))) : item, cs);
          if (best.is_undefined() || (want_max ? value_less(best_key, key) : value_less(key, best_key))) {
            best = item;
            best_key = key;
          }
        }
        return best.is_undefined() ? Value::undefined("No aggregated item, sequence was empty.") : best;
      };
    };
    f["max"] = extreme(true);
    f["min"] = extreme(false);
    f["attr"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      ArgBinder b("attr", a, {"name"});
      Value r = get_attr(ctx, v, b.get_str(0));
      // attr() is Python attribute lookup only: a dict's keys are not attributes.
      if (v.is_object() && !v.is_namespace() && !r.is_callable()) {
        return Value::undefined("'dict object' has no attribute '" + b.get_str(0) + "'");
      }
      return r;
    };
    f["pprint"] = [](RenderContext&, const Value& v, CallArgs&) { return Value(v.repr()); };
    f["format"] = [](RenderContext& ctx, const Value& v, CallArgs& a) {
      Value args = a.positional.size() == 1 ? a.positional[0] : Value::array(a.positional, true);
      if (a.positional.size() == 1 && args.is_array() && args.arr()->is_tuple) args = Value::array({args}, true);
      return binary_arith(ctx, BinaryOp::Mod, Value(text_of(v)), args);
    };
    return f;
  }();
  return kFilters;
}

bool compare_test(const Value& a, const Value& b, const char* op) {
  std::string o(op);
  if (o == "==") return values_equal(a, b);
  if (o == "!=") return !values_equal(a, b);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (o == "<") return value_less(a, b);
  if (o == ">") return value_less(b, a);
  if (o == "<=") return !value_less(b, a);
  return !value_less(a, b);
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> kTests = [] {
    std::unordered_map<std::string, TestFn> t;
    auto unary = [](std::function<bool(const Value&)> pred) {
      return [pred](RenderContext&, const Value& v, std::vector<Value>&) { return pred(v); };
    };
    t["defined"] = unary([](const Value& v) { return !v.is_undefined(); });
    t["undefined"] = unary([](const Value& v) { return v.is_undefined(); });
    t["none"] = unary([](const Value& v) { return v.is_none(); });
    t["string"] = unary([](const Value& v) { return v.is_string(); });
    t["number"] = unary([](const Value& v) { return v.is_number() || v.is_bool(); });
    t["integer"] = unary([](const Value& v) { return v.is_int(); });
    t["float"] = unary([](const Value& v) { return v.is_float(); });
    t["boolean"] = unary([](const Value& v) { return v.is_bool(); });
    t["true"] = unary([](const Value& v) { return v.is_bool() && v.as_bool(); });
    t["false"] = unary([](const Value& v) { return v.is_bool() && !v.as_bool(); });
    t["mapping"] = unary([](const Value& v) { return v.is_object() && !v.is_namespace(); });
    t["sequence"] = unary([](const Value& v) { return v.is_array() || v.is_string() || (v.is_object() && !v.is_namespace()); });
    t["iterable"] = unary([](const Value& v) {
      return v.is_array() || v.is_string() || v.is_undefined() || (v.is_object() && !v.is_namespace());
    });
    t["callable"] = unary([](const Value& v) { return v.is_callable(); });
    t["lower"] = unary([](const Value& v) { return v.is_string() && py_lower(v.str()) == v.str(); });
    t["upper"] = unary([](const Value& v) { return v.is_string() && py_upper(v.str()) == v.str(); });
    t["escaped"] = unary([](const Value&) { return false; });
    // Python's `value % divisor`, compared with `want`: integers stay integers (no overflow for -1), and
    // a float operand takes the float path, so a huge or fractional float never converts to int64.
    auto remainder_is = [](const Value& v, const Value& divisor, int64_t want) {
      for (const Value* x : {&v, &divisor}) {
        if (x->is_undefined()) fail_undefined(*x);
        DI_CHECK(x->is_int() || x->is_bool() || x->is_float(), "unsupported operand type for %: '{}'",
                 x->type_name());
      }
      if (!v.is_float() && !divisor.is_float()) {
        const int64_t d = divisor.is_bool() ? static_cast<int64_t>(divisor.as_bool()) : divisor.as_int();
        const int64_t n = v.is_bool() ? static_cast<int64_t>(v.as_bool()) : v.as_int();
        DI_CHECK(d != 0, "integer division or modulo by zero");
        if (d == -1) return want == 0;
        int64_t m = n % d;
        if (m != 0 && (m < 0) != (d < 0)) m += d;
        return m == want;
      }
      const double d = divisor.to_double();
      DI_CHECK(d != 0.0, "float modulo");
      double m = std::fmod(v.to_double(), d);
      if (m != 0.0 && (m < 0.0) != (d < 0.0)) m += d;
      return m == static_cast<double>(want);
    };
    const Value two(static_cast<int64_t>(2));
    t["even"] = [remainder_is, two](RenderContext&, const Value& v, std::vector<Value>&) {
      return remainder_is(v, two, 0);
    };
    t["odd"] = [remainder_is, two](RenderContext&, const Value& v, std::vector<Value>&) {
      return remainder_is(v, two, 1);
    };
    t["divisibleby"] = [remainder_is](RenderContext&, const Value& v, std::vector<Value>& a) {
      DI_CHECK(a.size() == 1, "divisibleby needs one argument");
      return remainder_is(v, a[0], 0);
    };
    auto cmp = [](const char* op) {
      return [op](RenderContext&, const Value& v, std::vector<Value>& a) {
        DI_CHECK(a.size() == 1, "the '{}' test needs one argument", op);
        return compare_test(v, a[0], op);
      };
    };
    t["eq"] = t["equalto"] = t["=="] = cmp("==");
    t["ne"] = t["!="] = cmp("!=");
    t["lt"] = t["lessthan"] = t["<"] = cmp("<");
    t["le"] = t["<="] = cmp("<=");
    t["gt"] = t["greaterthan"] = t[">"] = cmp(">");
    t["ge"] = t[">="] = cmp(">=");
    t["in"] = [](RenderContext&, const Value& v, std::vector<Value>& a) {
      DI_CHECK(a.size() == 1, "the 'in' test needs one argument");
      return contains(a[0], v);
    };
    t["sameas"] = [](RenderContext&, const Value& v, std::vector<Value>& a) {
      DI_CHECK(a.size() == 1, "the 'sameas' test needs one argument");
      const Value& o = a[0];
      if (v.kind() != o.kind()) return false;
      if (v.is_array()) return v.arr() == o.arr();
      if (v.is_object()) return v.obj() == o.obj();
      return values_equal(v, o);
    };
    return t;
  }();
  return kTests;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }
bool has_test(const std::string& name) { return tests().count(name) != 0; }

Value apply_filter(RenderContext& ctx, const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  DI_CHECK(it != filters().end(), "no filter named '{}'", name);
  return it->second(ctx, input, args);
}

bool apply_test(RenderContext& ctx, const std::string& name, const Value& input, std::vector<Value>& args) {
  auto it = tests().find(name);
  DI_CHECK(it != tests().end(), "no test named '{}'", name);
  return it->second(ctx, input, args);
}

}  // namespace deepinfer::jinja
