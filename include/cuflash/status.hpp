// Status: the one error channel of the API. Every call returns one; a failed
// call has written nothing to any output.
#pragma once

#include <string>
#include <utility>

namespace cuflash {

enum class StatusCode {
  ok = 0,
  invalid_argument,  // the caller passed something wrong; the message names it
  unsupported,       // valid input that the chosen backend cannot run
  cuda_error,        // a CUDA runtime or launch failure
  cudnn_error,       // a cuDNN failure
  internal,          // a bug in cuflash
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status success() { return {}; }
  static Status invalid(std::string message) { return {StatusCode::invalid_argument, std::move(message)}; }
  static Status unsupported(std::string message) { return {StatusCode::unsupported, std::move(message)}; }

  bool ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: q: expected rank 4, got rank 3"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

}  // namespace cuflash

// Propagates a failed Status to the caller.
#define CUFLASH_TRY(expr)                          \
  do {                                             \
    ::cuflash::Status cuflash_try_status_ = (expr); \
    if (!cuflash_try_status_.ok()) return cuflash_try_status_; \
  } while (0)
