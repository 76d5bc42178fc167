// Backends that are not compiled into this build answer nullptr here; the
// compiled ones define these functions in their own folders.
#include "backend.hpp"

namespace cuflash::detail {

#if !defined(CUFLASH_WITH_CUDA)
BackendImpl* cuda_backend() { return nullptr; }
#endif
#if !defined(CUFLASH_WITH_CUDNN)
BackendImpl* cudnn_backend() { return nullptr; }
#endif

}  // namespace cuflash::detail
