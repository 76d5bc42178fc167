// cuflash_c.h must compile as C++ too (extern "C" linkage).
#include "cuflash/cuflash_c.h"

int cuflash_header_cxx_check() { return static_cast<int>(sizeof(cuflash_tensor)) + CUFLASH_OK; }
