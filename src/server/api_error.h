// ApiError: a request the server refuses, with its HTTP status and the fields
// of the OpenAI error body {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <string>

#include "core/error.h"

namespace deepinfer::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = {})
      : Error(message), status_(status), param_(std::move(param)), type_(std::move(type)) {
    if (type_.empty()) type_ = default_type(status);
  }
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }

  static std::string default_type(int status) {
    switch (status) {
      case 400: case 404: case 405: case 413: return "invalid_request_error";
      case 401: return "authentication_error";
      case 429: return "rate_limit_error";
      case 503: return "overloaded_error";
      default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
  }

 private:
  int status_;
  std::string param_;
  std::string type_;
};

// 400 for a bad field.
[[noreturn]] inline void bad_param(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

}  // namespace deepinfer::server
