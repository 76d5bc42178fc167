// Per-device facts the launchers size grids with, read once per device.
#pragma once

namespace cuflash::detail {

struct DeviceInfo {
  int sm_count = 0;
  int major = 0, minor = 0;  // compute capability
  int max_smem_per_block = 0;  // opt-in limit, bytes
  int smem_per_sm = 0;         // shared memory of one SM, bytes (CTAs per SM)
  // The driver's TMA map encoder is reachable (sm90/tma_map.hpp): the TMA
  // kernels can be planned. (A fact of the process, kept here so that the
  // plan's tests can describe a GPU without having one.)
  bool tma_encoder = false;
  bool valid = false;
};

// Cached; `valid` is false when the device cannot be queried.
const DeviceInfo& device_info(int device);

}  // namespace cuflash::detail
