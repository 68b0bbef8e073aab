// XGrammar's log hooks (built with XGRAMMAR_LOG_CUSTOMIZE, cmake/xgrammar.cmake):
// its fatal errors become exceptions with the bare message, and its warnings
// — the parts of a schema or regex it approximates — go to the compilation
// that caused them (structured::collect_grammar_warnings) instead of stderr.
#include "structured/xgrammar_logging.h"

#include <ctime>

#include <xgrammar/xgrammar.h>

#include "core/logging.h"
#include "support/logging.h"

namespace deepinfer::structured {

namespace {
thread_local std::vector<std::string>* warning_sink = nullptr;
}  // namespace

WarningCollector::WarningCollector() : previous_(warning_sink) { warning_sink = &warnings_; }
WarningCollector::~WarningCollector() { warning_sink = previous_; }

}  // namespace deepinfer::structured

namespace xgrammar {

[[noreturn]] void LogFatalImpl(const std::string& file, int lineno, const std::string& message) {
  throw LogFatalError(file, lineno, message, std::time(nullptr));
}

void LogMessageImpl(const std::string& /*file*/, int /*lineno*/, int level, const std::string& message) {
  if (deepinfer::structured::warning_sink != nullptr && level == XGRAMMAR_LOG_LEVEL_WARNING) {
    deepinfer::structured::warning_sink->push_back(message);
    return;
  }
  deepinfer::log_debug("xgrammar: {}", message);
}

}  // namespace xgrammar
