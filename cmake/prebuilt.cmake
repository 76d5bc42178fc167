# The library as an imported target, from a libcuflash.so that a build of these
# sources already made (CUFLASH_PREBUILT_LIBRARY, e.g. build/src/libcuflash.so
# after scripts/build.sh), so that the Python package does not compile every
# CUDA kernel a second time: scripts/test-python.sh passes it to `pip install .`
# when build/ has one. Without it (a bare `pip install .`) src/ is compiled.
#
# The package then has the backends that library was built with, cuDNN
# included when build/ found it (pyproject.toml's CUFLASH_ENABLE_CUDNN applies
# only when src/ is compiled). The library keeps the RUNPATH its build gave it
# (the folders of libcudnn and NVRTC, where they are not system folders).
# Sets CUFLASH_PREBUILT_FILE (the file, symlinks resolved),
# CUFLASH_PREBUILT_SONAME (the name the module will ask the loader for, under
# which python/CMakeLists.txt installs the file into the package) and
# CUFLASH_PREBUILT_RUNPATH (what the installed copy's RUNPATH is set to).
if(CUFLASH_BUILD_TESTS OR CUFLASH_BUILD_TOOLS)
  message(FATAL_ERROR "CUFLASH_PREBUILT_LIBRARY is for the Python package alone: "
                      "set CUFLASH_BUILD_TESTS=OFF and CUFLASH_BUILD_TOOLS=OFF (pip install . does)")
endif()
if(NOT IS_ABSOLUTE "${CUFLASH_PREBUILT_LIBRARY}" OR NOT EXISTS "${CUFLASH_PREBUILT_LIBRARY}")
  message(FATAL_ERROR "CUFLASH_PREBUILT_LIBRARY: ${CUFLASH_PREBUILT_LIBRARY} is not an absolute path to a file")
endif()
file(REAL_PATH "${CUFLASH_PREBUILT_LIBRARY}" CUFLASH_PREBUILT_FILE)

# The linker records the library's SONAME (libcuflash.so.0 in a build tree,
# whose file is libcuflash.so.0.1.0 behind two symlinks) as the module's
# dependency, so the package must hold the file under that name.
get_filename_component(CUFLASH_PREBUILT_SONAME "${CUFLASH_PREBUILT_FILE}" NAME)
if(CMAKE_READELF)
  execute_process(COMMAND "${CMAKE_READELF}" -d "${CUFLASH_PREBUILT_FILE}" OUTPUT_VARIABLE dynamic_section
                  RESULT_VARIABLE readelf_status ERROR_QUIET)
  if(readelf_status EQUAL 0 AND dynamic_section MATCHES "\\(SONAME\\)[^[]*\\[([^]]+)\\]")
    set(CUFLASH_PREBUILT_SONAME "${CMAKE_MATCH_1}")
  endif()
endif()
if(NOT CUFLASH_PREBUILT_SONAME MATCHES "^libcuflash\\.so")
  message(FATAL_ERROR "CUFLASH_PREBUILT_LIBRARY: ${CUFLASH_PREBUILT_FILE} is not a libcuflash.so (its name: ${CUFLASH_PREBUILT_SONAME})")
endif()

# Its RUNPATH as the package will hold it: the build's, less the empty entries
# CMake pads a build tree's RUNPATH with (an empty entry means the current
# directory to the loader).
set(CUFLASH_PREBUILT_RUNPATH "")
if(dynamic_section MATCHES "\\((RUNPATH|RPATH)\\)[^[]*\\[([^]]*)\\]")
  string(REPLACE ":" ";" runpath_entries "${CMAKE_MATCH_2}")
  list(FILTER runpath_entries EXCLUDE REGEX "^$")
  list(JOIN runpath_entries ":" CUFLASH_PREBUILT_RUNPATH)
endif()

add_library(cuflash SHARED IMPORTED)
set_target_properties(cuflash PROPERTIES IMPORTED_LOCATION "${CUFLASH_PREBUILT_FILE}" IMPORTED_SONAME "${CUFLASH_PREBUILT_SONAME}"
                      INTERFACE_INCLUDE_DIRECTORIES "${PROJECT_SOURCE_DIR}/include")
add_library(cuflash::cuflash ALIAS cuflash)

# Its cuDNN backend shows as a DT_NEEDED entry (CUDA is linked statically).
set(prebuilt_cudnn "without")
if(dynamic_section MATCHES "libcudnn")
  set(prebuilt_cudnn "with")
endif()
message(STATUS "cuflash: prebuilt library ${CUFLASH_PREBUILT_FILE} (as ${CUFLASH_PREBUILT_SONAME}, ${prebuilt_cudnn} the cuDNN backend); src/ is not compiled")
