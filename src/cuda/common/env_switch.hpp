// Switches for measuring and testing (CUFLASH_SM90_FORWARD=0 and the like):
// on unless the variable is "0"; and integer knobs (CUFLASH_FORWARD_SPLITS=n
// and the like): the variable's value, `unset` when it is not set. Callers
// read each once per process.
#pragma once

#include <cstdlib>
#include <string>

namespace cuflash::detail {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v) != "0";
}

inline int env_int(const char* name, int unset) {
  const char* v = std::getenv(name);
  return v == nullptr ? unset : std::atoi(v);
}

}  // namespace cuflash::detail
