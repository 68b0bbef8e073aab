// Helpers shared by the Jinja/chat-template tests.
#pragma once

#include <nlohmann/json.hpp>

#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include "tokenizer/jinja/render_context.h"

namespace deepinfer::test {

inline std::string source_dir() { return DEEPINFER_SOURCE_DIR; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string data_path(const std::string& name) { return source_dir() + "/tests/data/chat_template/" + name; }

inline nlohmann::ordered_json read_json(const std::string& path) { return nlohmann::ordered_json::parse(read_file(path)); }

// The reference data pins strftime_now to 2024-07-26 14:05:09 (a Friday).
inline std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 14;
  tm.tm_min = 5;
  tm.tm_sec = 9;
  tm.tm_wday = 5;
  tm.tm_yday = 207;
  return tm;
}

}  // namespace deepinfer::test
