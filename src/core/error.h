// Errors: every failure caused by bad input (files, requests, configs) is reported
// by throwing deepinfer::Error with a message that says what was wrong and where.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace deepinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace deepinfer

// Checks a condition that depends on input data; throws deepinfer::Error when it fails.
#define DI_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) ::deepinfer::fail(__VA_ARGS__); \
  } while (0)
