#include "sm90/tma_map.hpp"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <string>

namespace cuflash::detail::sm90 {

namespace {

constexpr std::int64_t kStrideLimit = std::int64_t{1} << 40;  // bytes
constexpr int kElementBytes = 2;

// cuTensorMapEncodeTiled from the driver the runtime already loaded; looked
// up once per process.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &symbol, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      symbol = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(symbol);
  }();
  return fn;
}

// The byte stride TMA gets for a dimension: the caller's, or for a
// dimension of extent 1 (never stepped over) a harmless legal value.
std::int64_t byte_stride(std::int64_t elements, std::int64_t extent) {
  if (extent <= 1) return 16;
  return elements * kElementBytes;
}

bool stride_ok(std::int64_t bytes) { return bytes > 0 && bytes % 16 == 0 && bytes < kStrideLimit; }

}  // namespace

bool tma_layout_ok(const HeadRowsTensor& t) {
  // Rows of whole 16-byte chunks; the box's columns past head_dim read as zeros.
  if (reinterpret_cast<std::uintptr_t>(t.base) % 16 != 0 || t.head_dim % 8 != 0) return false;
  return stride_ok(byte_stride(t.strides.row, t.rows)) && stride_ok(byte_stride(t.strides.head, t.heads)) &&
         stride_ok(byte_stride(t.strides.batch, t.batch)) && t.rows < (std::int64_t{1} << 31);
}

bool tma_encoder_available() { return encoder() != nullptr; }

Status encode_head_rows_map(CUtensorMap* map, const HeadRowsTensor& t, int box_rows, const char* name) {
  if (!tma_layout_ok(t) || !tma_encoder_available())
    return {StatusCode::internal, std::string("backend cuda: no TMA map for ") + name + " (its layout, or the driver's encoder, was not checked)"};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.head_dim), static_cast<cuuint64_t>(t.rows),
                              static_cast<cuuint64_t>(t.heads), static_cast<cuuint64_t>(t.batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(byte_stride(t.strides.row, t.rows)),
                                 static_cast<cuuint64_t>(byte_stride(t.strides.head, t.heads)),
                                 static_cast<cuuint64_t>(byte_stride(t.strides.batch, t.batch))};
  // One 64-element (128-byte) column block: the widest box a 128-byte
  // swizzle allows, and one block of the Sw128Tile layout.
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  // The type only sizes the elements and picks the zero fill: bf16 also
  // serves fp16 (both are 2 bytes; zero is all-zero bits in both).
  const CUresult r = encoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(t.base), dims, strides, box,
                               element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return {StatusCode::internal, std::string("backend cuda: cuTensorMapEncodeTiled failed for ") + name +
                                      " (CUresult " + std::to_string(static_cast<int>(r)) + ")"};
  return {};
}

}  // namespace cuflash::detail::sm90
