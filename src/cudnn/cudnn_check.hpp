// cuDNN failures become Status values (cudnn_error) naming the call.
#pragma once

#include <cudnn.h>

#include <string>

#include "cuflash/status.hpp"

namespace cuflash::detail::cudnn {

inline Status cudnn_status(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return {};
  return {StatusCode::cudnn_error, std::string(what) + ": " + cudnnGetErrorString(status)};
}

// "9.19.0": the cuDNN library loaded at run time (which may differ from the headers built against).
inline std::string cudnn_runtime_version() {
  const std::size_t v = cudnnGetVersion();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace cuflash::detail::cudnn
