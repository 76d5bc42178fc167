# Finds what the cuDNN backend needs: libcudnn 9 (header + library from one
# install) and the header-only cuDNN frontend (scripts/fetch-cudnn-frontend.sh
# puts it in .deps/cudnn-frontend/include). Sets CUFLASH_HAS_CUDNN, and when ON
# the imported target cuflash::cudnn_library, CUFLASH_CUDNN_INCLUDE_DIR,
# CUFLASH_CUDNN_LIBRARY_DIR, CUFLASH_CUDNN_VERSION and
# CUFLASH_CUDNN_FRONTEND_INCLUDE_DIR. Without either piece the build goes on
# without the backend, which then answers "not compiled into this build".
#
# Where libcudnn is looked for, first complete install wins:
#   1. CUFLASH_CUDNN_ROOT (a folder with include/cudnn.h and lib/libcudnn.so.9)
#   2. PyTorch's wheel (…/site-packages/nvidia/cudnn under /opt/torch/.venv or
#      CUFLASH_TORCH_VENV): on the GPU machine PyTorch's cuDNN SDPA is the peer
#      the benchmark compares with, so both run on the same library
#   3. the CUDA toolkit's folders, 4. the system's (Debian multiarch) folders.
set(CUFLASH_HAS_CUDNN OFF)
set(CUFLASH_CUDNN_ROOT "" CACHE PATH "A cuDNN 9 install (include/cudnn.h, lib/libcudnn.so.9) to use first")
set(CUFLASH_TORCH_VENV "/opt/torch/.venv" CACHE PATH "A Python environment whose nvidia-cudnn wheel may provide cuDNN")
set(CUFLASH_CUDNN_FRONTEND_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/include" CACHE PATH
    "The cuDNN frontend headers (scripts/fetch-cudnn-frontend.sh)")

if(NOT CUFLASH_ENABLE_CUDNN)
  set(CUFLASH_CUDNN_REASON "CUFLASH_ENABLE_CUDNN is OFF")
  return()
endif()
if(NOT CUFLASH_HAS_CUDA)
  set(CUFLASH_CUDNN_REASON "it needs the CUDA backend's toolchain, which is OFF")
  return()
endif()

# (include dir, library file) of one candidate install, or empty.
function(cuflash_cudnn_in_root root out_include out_library)
  set(${out_include} "" PARENT_SCOPE)
  set(${out_library} "" PARENT_SCOPE)
  set(include "")
  foreach(dir "${root}/include" "${root}/include/x86_64-linux-gnu" "${root}/targets/x86_64-linux/include")
    if(EXISTS "${dir}/cudnn.h" AND EXISTS "${dir}/cudnn_version.h")
      set(include "${dir}")
      break()
    endif()
  endforeach()
  if(NOT include)
    return()
  endif()
  # The wheel ships libcudnn.so.9 without the unversioned symlink: link the file itself.
  foreach(dir "${root}/lib" "${root}/lib64" "${root}/lib/x86_64-linux-gnu" "${root}/targets/x86_64-linux/lib")
    foreach(name libcudnn.so.9 libcudnn.so)
      if(EXISTS "${dir}/${name}")
        set(${out_include} "${include}" PARENT_SCOPE)
        set(${out_library} "${dir}/${name}" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
endfunction()

set(candidates "")
if(CUFLASH_CUDNN_ROOT)
  list(APPEND candidates "${CUFLASH_CUDNN_ROOT}")
endif()
file(GLOB torch_cudnn_roots LIST_DIRECTORIES true "${CUFLASH_TORCH_VENV}/lib/python3*/site-packages/nvidia/cudnn")
list(APPEND candidates ${torch_cudnn_roots})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND candidates "${CUDAToolkit_LIBRARY_ROOT}")
endif()
get_filename_component(cuda_root_from_include "${CUDAToolkit_INCLUDE_DIRS}" DIRECTORY)
list(APPEND candidates "${cuda_root_from_include}" "/usr/local/cuda" "/usr")
list(REMOVE_DUPLICATES candidates)

set(found_include "")
set(found_library "")
foreach(root IN LISTS candidates)
  cuflash_cudnn_in_root("${root}" found_include found_library)
  if(found_include)
    break()
  endif()
endforeach()

if(NOT found_include)
  set(CUFLASH_CUDNN_REASON "no cuDNN 9 found (looked in: ${candidates}; set CUFLASH_CUDNN_ROOT)")
  return()
endif()
file(STRINGS "${found_include}/cudnn_version.h" version_lines REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
set(CUFLASH_CUDNN_VERSION "")
foreach(part MAJOR MINOR PATCHLEVEL)
  string(REGEX MATCH "#define CUDNN_${part} ([0-9]+)" _ "${version_lines}")
  list(APPEND CUFLASH_CUDNN_VERSION "${CMAKE_MATCH_1}")
endforeach()
list(JOIN CUFLASH_CUDNN_VERSION "." CUFLASH_CUDNN_VERSION)
if(NOT CUFLASH_CUDNN_VERSION MATCHES "^9\\.")
  set(CUFLASH_CUDNN_REASON "cuDNN ${CUFLASH_CUDNN_VERSION} at ${found_include} is not version 9")
  return()
endif()
if(NOT EXISTS "${CUFLASH_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend.h")
  set(CUFLASH_CUDNN_REASON "no cuDNN frontend headers in ${CUFLASH_CUDNN_FRONTEND_INCLUDE_DIR} (run scripts/fetch-cudnn-frontend.sh)")
  return()
endif()

set(CUFLASH_CUDNN_INCLUDE_DIR "${found_include}")
get_filename_component(CUFLASH_CUDNN_LIBRARY_DIR "${found_library}" DIRECTORY)
add_library(cuflash_cudnn_library SHARED IMPORTED)
set_target_properties(cuflash_cudnn_library PROPERTIES IMPORTED_LOCATION "${found_library}"
                      INTERFACE_INCLUDE_DIRECTORIES "${CUFLASH_CUDNN_INCLUDE_DIR}")
add_library(cuflash::cudnn_library ALIAS cuflash_cudnn_library)
set(frontend_version "unknown")
if(EXISTS "${CUFLASH_CUDNN_FRONTEND_INCLUDE_DIR}/../VERSION")
  file(STRINGS "${CUFLASH_CUDNN_FRONTEND_INCLUDE_DIR}/../VERSION" frontend_version LIMIT_COUNT 1)
endif()
set(CUFLASH_CUDNN_REASON "cuDNN ${CUFLASH_CUDNN_VERSION} (${found_library}), frontend ${frontend_version}")
set(CUFLASH_HAS_CUDNN ON)
