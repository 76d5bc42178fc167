# cuflash/_ext_torch.so (python/src/torch_ext.cpp): cuflash's torch operators in
# C++, with a C++ autograd node. Built beside the nanobind module when the
# Python that builds the package can import torch; CUFLASH_TORCH_EXT chooses:
#   AUTO (default)  build it when torch is found, else leave it out (the package
#                   then defines the operators in Python, cuflash/_torch_py_ops.py)
#   ON              torch is required (configure fails without it)
#   OFF             never build it
# Under pip's build isolation the build's Python does not see the environment's
# packages, torch included; the probe then runs that same interpreter once
# more without pip's PYTHONPATH, i.e. on the environment the package is
# installed into. The library is compiled against torch's headers and linked to
# its libraries by plain paths (torch's CMake config would look for a CUDA
# toolkit, which this file needs none of): no CUDA header is included.
set(CUFLASH_TORCH_EXT "$ENV{CUFLASH_TORCH_EXT}" CACHE STRING
    "Build cuflash's torch operators in C++ (_ext_torch.so): AUTO (when torch is importable), ON, OFF")
string(TOUPPER "${CUFLASH_TORCH_EXT}" torch_ext_mode)
if(torch_ext_mode MATCHES "^(ON|1|TRUE|YES|REQUIRE)$")
  set(torch_ext_mode ON)
elseif(torch_ext_mode MATCHES "^(OFF|0|FALSE|NO)$")
  set(torch_ext_mode OFF)
else()
  set(torch_ext_mode AUTO)
endif()

set(CUFLASH_HAS_TORCH_EXT OFF)
if(NOT torch_ext_mode STREQUAL "OFF")
  set(torch_probe "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)")
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "${torch_probe}" RESULT_VARIABLE torch_status
                  OUTPUT_VARIABLE torch_lines ERROR_VARIABLE torch_error OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(torch_where "")
  if(NOT torch_status EQUAL 0 AND DEFINED ENV{PYTHONPATH})
    set(torch_where ", seen past PYTHONPATH (pip's build isolation)")
    execute_process(COMMAND "${CMAKE_COMMAND}" -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
                            "${Python_EXECUTABLE}" -c "${torch_probe}" RESULT_VARIABLE torch_status
                    OUTPUT_VARIABLE torch_lines ERROR_VARIABLE torch_error OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  set(torch_reason "")
  if(torch_status EQUAL 0)
    string(REPLACE "\n" ";" torch_lines "${torch_lines}")
    list(LENGTH torch_lines torch_line_count)
    math(EXPR torch_last "${torch_line_count} - 3")
    list(SUBLIST torch_lines ${torch_last} 3 torch_lines)  # after anything torch itself printed
    list(GET torch_lines 0 CUFLASH_TORCH_DIR)
    list(GET torch_lines 1 CUFLASH_TORCH_CXX11_ABI)
    list(GET torch_lines 2 CUFLASH_TORCH_VERSION)
    if(NOT CUFLASH_TORCH_CXX11_ABI EQUAL 1)
      # libcuflash's C++ API returns std::string (Status): one ABI for both sides.
      set(torch_reason "torch ${CUFLASH_TORCH_VERSION} was built with the pre-C++11 std::string ABI")
    elseif(NOT EXISTS "${CUFLASH_TORCH_DIR}/include/torch/library.h" OR NOT EXISTS "${CUFLASH_TORCH_DIR}/lib/libtorch_cpu.so")
      set(torch_reason "torch ${CUFLASH_TORCH_VERSION} in ${CUFLASH_TORCH_DIR} has no C++ headers or libtorch_cpu.so")
    else()
      set(CUFLASH_HAS_TORCH_EXT ON)
    endif()
  else()
    string(STRIP "${torch_error}" torch_error)
    string(REGEX REPLACE ".*\n" "" torch_error "${torch_error}")
    set(torch_reason "${Python_EXECUTABLE} cannot import torch (${torch_error})")
  endif()
  if(CUFLASH_HAS_TORCH_EXT)
    message(STATUS "cuflash: torch operators in C++ ON (torch ${CUFLASH_TORCH_VERSION}, ${CUFLASH_TORCH_DIR}${torch_where})")
  elseif(torch_ext_mode STREQUAL "ON")
    message(FATAL_ERROR "CUFLASH_TORCH_EXT=ON: ${torch_reason}")
  else()
    message(STATUS "cuflash: torch operators in C++ OFF: ${torch_reason}")
  endif()
else()
  message(STATUS "cuflash: torch operators in C++ OFF (CUFLASH_TORCH_EXT=${CUFLASH_TORCH_EXT})")
endif()

if(CUFLASH_HAS_TORCH_EXT)
  # A plain shared library (no Python module init): cuflash/_torch_ext.py loads it
  # with torch.ops.load_library. Its name starts with _ext so that a package
  # assembled from build/python/_ext*.so picks it up with the module.
  add_library(_ext_torch MODULE ${PROJECT_SOURCE_DIR}/python/src/torch_ext.cpp)
  set_target_properties(_ext_torch PROPERTIES PREFIX "" SUFFIX ".so" CXX_VISIBILITY_PRESET hidden
                        INSTALL_RPATH "$ORIGIN" BUILD_RPATH "$ORIGIN;$<TARGET_FILE_DIR:cuflash>;${CUFLASH_TORCH_DIR}/lib")
  target_include_directories(_ext_torch SYSTEM PRIVATE "${CUFLASH_TORCH_DIR}/include"
                             "${CUFLASH_TORCH_DIR}/include/torch/csrc/api/include")
  target_compile_definitions(_ext_torch PRIVATE _GLIBCXX_USE_CXX11_ABI=1
                             CUFLASH_TORCH_VERSION="${CUFLASH_TORCH_VERSION}")
  # torch's libraries are in the process before this one is loaded (torch is
  # imported first); the loader matches them by soname.
  target_link_libraries(_ext_torch PRIVATE cuflash "${CUFLASH_TORCH_DIR}/lib/libtorch_cpu.so"
                        "${CUFLASH_TORCH_DIR}/lib/libc10.so")
endif()
