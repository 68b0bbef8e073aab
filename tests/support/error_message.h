// The message of the deepinfer::Error a callable throws, for tests that check
// what an error says ("(no error)" when it throws nothing).
#pragma once

#include <string>

#include "core/error.h"

namespace deepinfer::testing {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace deepinfer::testing
