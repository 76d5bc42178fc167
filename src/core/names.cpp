// Printable names of the API's enums and Status.
#include <string>

#include "cuflash/linear_attention.hpp"
#include "cuflash/options.hpp"
#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"
#include "problem.hpp"

namespace cuflash {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::cuda_error: return "cuda_error";
    case StatusCode::cudnn_error: return "cudnn_error";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "auto";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
    case Backend::cudnn: return "cudnn";
  }
  return "unknown";
}

const char* feature_map_name(FeatureMap map) {
  switch (map) {
    case FeatureMap::identity: return "identity";
    case FeatureMap::elu_plus_one: return "elu+1";
    case FeatureMap::relu: return "relu";
  }
  return "unknown";
}

namespace detail {
const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::dense: return "dense";
    case Layout::varlen: return "varlen";
    case Layout::kv_cache: return "kv_cache";
  }
  return "unknown";
}
}  // namespace detail

}  // namespace cuflash
