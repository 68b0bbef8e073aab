// Collects the warnings XGrammar logs on this thread while the collector
// lives (see xgrammar_logging.cpp).
#pragma once

#include <string>
#include <vector>

namespace deepinfer::structured {

class WarningCollector {
 public:
  WarningCollector();
  ~WarningCollector();
  WarningCollector(const WarningCollector&) = delete;
  WarningCollector& operator=(const WarningCollector&) = delete;
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  std::vector<std::string> warnings_;
  std::vector<std::string>* previous_;
};

}  // namespace deepinfer::structured
