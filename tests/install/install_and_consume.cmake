# cmake -DBUILD_DIR= -DPREFIX= -DCONSUMER_SOURCE= -DCONSUMER_BUILD= -DGENERATOR= -DCXX_COMPILER= -DBUILD_TYPE=
#       -P install_and_consume.cmake
function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE exit_code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT exit_code EQUAL 0)
    message(FATAL_ERROR "${name} failed (exit code ${exit_code}):\n${out}${err}")
  endif()
  message(STATUS "${name}: ok")
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${PREFIX}" "${CONSUMER_BUILD}")
step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${PREFIX}")

# Only the installed package may be found: no package registry, no build tree.
step("configure the consumer" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE}" -B "${CONSUMER_BUILD}" -G "${GENERATOR}"
     "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
string(FIND "${step_output}" "cuflash_DIR=${PREFIX}/" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the consumer found cuflash somewhere other than ${PREFIX}:\n${step_output}")
endif()

step("build the consumer" ${CMAKE_COMMAND} --build "${CONSUMER_BUILD}")
# The consumer finds the installed libcuflash.so through the build RPATH that
# CMake gives executables linked to imported shared libraries.
step("run the consumer" "${CONSUMER_BUILD}/cuflash_consumer")
message(STATUS "${step_output}")
