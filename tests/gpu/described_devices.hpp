// GPUs described for the plans' tests (forward_plan_test.cpp,
// backward_plan_test.cpp), which run without a GPU: an H100 SXM (with a
// driver to encode TMA maps) and an A100.
#pragma once

#include "common/device_info.hpp"

namespace cuflash::test {

inline detail::DeviceInfo described_h100() {
  detail::DeviceInfo d;
  d.sm_count = 132;
  d.major = 9;
  d.minor = 0;
  d.max_smem_per_block = 227 * 1024;
  d.smem_per_sm = 228 * 1024;
  d.tma_encoder = true;  // a driver to encode the TMA maps with
  d.valid = true;
  return d;
}

inline detail::DeviceInfo described_a100() {
  detail::DeviceInfo d = described_h100();
  d.sm_count = 108;
  d.major = 8;
  d.max_smem_per_block = 163 * 1024;
  d.smem_per_sm = 164 * 1024;
  return d;
}

}  // namespace cuflash::test
