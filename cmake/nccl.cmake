# NCCL for ring attention (src/dist/ring.cpp): looked for in the CUDA
# toolkit, the system, CUFLASH_NCCL_ROOT (e.g. a pip nvidia-nccl package's
# nvidia/nccl folder) and NCCL_ROOT. Sets CUFLASH_HAS_NCCL, CUFLASH_NCCL_REASON
# and the imported target cuflash::nccl.
set(CUFLASH_HAS_NCCL OFF)
set(CUFLASH_NCCL_REASON "")
if(NOT CUFLASH_ENABLE_NCCL)
  set(CUFLASH_NCCL_REASON "CUFLASH_ENABLE_NCCL=OFF")
elseif(NOT CUFLASH_HAS_CUDA)
  set(CUFLASH_NCCL_REASON "no CUDA backend")
else()
  set(hints ${CUFLASH_NCCL_ROOT} $ENV{CUFLASH_NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
            ${CUDAToolkit_TARGET_DIR})
  find_path(CUFLASH_NCCL_INCLUDE_DIR nccl.h HINTS ${hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(CUFLASH_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(CUFLASH_NCCL_INCLUDE_DIR AND CUFLASH_NCCL_LIBRARY)
    set(CUFLASH_HAS_NCCL ON)
    set(CUFLASH_NCCL_REASON "${CUFLASH_NCCL_LIBRARY}")
    add_library(cuflash::nccl UNKNOWN IMPORTED)
    set_target_properties(cuflash::nccl PROPERTIES IMPORTED_LOCATION "${CUFLASH_NCCL_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${CUFLASH_NCCL_INCLUDE_DIR}")
  else()
    set(CUFLASH_NCCL_REASON "nccl.h or libnccl not found (set CUFLASH_NCCL_ROOT)")
  endif()
endif()
