// Helpers for the tokenizer tests: locating and decompressing reference data.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace deepinfer::test {

inline std::string source_dir() { return DEEPINFER_SOURCE_DIR; }
inline std::string shared_tokenizer_dir(const std::string& family) {
  return source_dir() + "/../shared/tokenizers/" + family;
}

// Contents of an .xz file (decompressed by the xz tool); "" if it cannot be read.
inline std::string read_xz(const std::string& path) {
  std::string cmd = "xz -dc '" + path + "' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return {};
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe.get())) > 0) out.append(buf, n);
  return out;
}

// A family's tokenizer, loaded once per process.
const Tokenizer& family_tokenizer(const std::string& family);

}  // namespace deepinfer::test
