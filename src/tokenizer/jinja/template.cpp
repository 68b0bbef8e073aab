#include "tokenizer/jinja/template.h"

#include <ctime>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/interpreter.h"

namespace deepinfer::jinja {

std::tm local_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

RenderContext::~RenderContext() {
  // Emptying every mutated container breaks any reference cycle the template built.
  for (auto& v : mutated_) {
    if (v.is_array()) {
      std::vector<Value> items;
      items.swap(v.arr()->items);
    } else if (v.is_object()) {
      std::vector<std::pair<std::string, Value>> entries;
      entries.swap(v.obj()->entries);
      v.obj()->index.clear();
    }
  }
}

namespace {

Value make_namespace(RenderContext&, CallArgs& args) {
  Value ns = Value::object();
  ns.obj()->is_namespace = true;
  for (const auto& p : args.positional) {
    DI_CHECK(p.is_object() && !p.is_namespace(), "namespace() positional arguments must be dicts");
    for (const auto& [k, v] : p.obj()->entries) ns.obj()->set(k, v);
  }
  for (const auto& [k, v] : args.keyword) ns.obj()->set(k, v);
  return ns;
}

Value make_dict(RenderContext&, CallArgs& args) {
  Value d = Value::object();
  DI_CHECK(args.positional.empty() || (args.positional.size() == 1 && args.positional[0].is_object()),
           "dict() takes keyword arguments or one dict");
  if (!args.positional.empty()) {
    for (const auto& [k, v] : args.positional[0].obj()->entries) d.obj()->set(k, v);
  }
  for (const auto& [k, v] : args.keyword) d.obj()->set(k, v);
  return d;
}

Value make_range(RenderContext& ctx, CallArgs& args) {
  DI_CHECK(args.keyword.empty() && !args.positional.empty() && args.positional.size() <= 3,
           "range expected 1 to 3 integer arguments");
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < args.positional.size(); ++i) {
    const Value& a = args.positional[i];
    DI_CHECK(a.is_int() || a.is_bool(), "'{}' object cannot be interpreted as an integer", a.type_name());
    v[i] = a.is_bool() ? a.as_bool() : a.as_int();
  }
  int64_t start = args.positional.size() == 1 ? 0 : v[0];
  int64_t stop = args.positional.size() == 1 ? v[0] : v[1];
  int64_t step = args.positional.size() == 3 ? v[2] : 1;
  DI_CHECK(step != 0, "range() arg 3 must not be zero");
  // Computed in long double so that extreme bounds cannot overflow.
  long double count = step > 0 ? (static_cast<long double>(stop) - start + step - 1) / step
                               : (static_cast<long double>(start) - stop - step - 1) / -step;
  if (count < 0) count = 0;
  if (count > static_cast<long double>(ctx.budget().max_loop_iterations)) {
    fail("budget exceeded: range() of {} items (loop iteration limit {})", static_cast<double>(count),
         ctx.budget().max_loop_iterations);
  }
  ctx.check_size(static_cast<size_t>(count));
  std::vector<Value> items;
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) items.emplace_back(start + i * step);
  return Value::array(std::move(items));
}

Value raise_exception(RenderContext&, CallArgs& args) {
  std::string message = args.positional.empty() ? std::string() : args.positional[0].to_string();
  throw TemplateRaisedError(message);
}

Value strftime_now(RenderContext& ctx, CallArgs& args) {
  ArgBinder b("strftime_now", args, {"format"});
  const std::string& format = b.get_str(0);
  DI_CHECK(format.size() <= 256, "strftime_now format longer than 256 bytes");
  std::tm tm = ctx.now();
  char buf[2048];
  size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
  DI_CHECK(n > 0 || format.empty(), "strftime_now: format '{}' produced no output", format);
  return Value(std::string(buf, n));
}

}  // namespace

Template::Template(std::string_view source, const ParseOptions& options) : body_(parse_template(source, options)) {}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& globals, const RenderBudget& budget,
                             const NowFn& now) const {
  RenderContext ctx(budget, now);
  Interpreter interp(ctx);
  interp.set_global("namespace", Value::function("namespace", make_namespace));
  interp.set_global("dict", Value::function("dict", make_dict));
  interp.set_global("range", Value::function("range", make_range));
  interp.set_global("raise_exception", Value::function("raise_exception", raise_exception));
  interp.set_global("strftime_now", Value::function("strftime_now", strftime_now));
  for (const auto& [name, value] : globals) interp.set_global(name, value);
  return interp.run(body_);
}

}  // namespace deepinfer::jinja
