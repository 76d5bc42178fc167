# cmake -DRUSTC= -DDOC= -DLIBDIR= -DWORK= -P rust_example.cmake
# Compiles the ```rust block of docs/rust-binding.md against libcuflash.so and runs it.
file(READ "${DOC}" doc)
string(REGEX MATCH "```rust\n(.*)\n```" block "${doc}")
if(NOT CMAKE_MATCH_1)
  message(FATAL_ERROR "no ```rust block in ${DOC}")
endif()
file(MAKE_DIRECTORY "${WORK}")
file(WRITE "${WORK}/rust_example.rs" "${CMAKE_MATCH_1}\n")
execute_process(COMMAND "${RUSTC}" --edition 2021 -L "${LIBDIR}" "-Clink-arg=-Wl,-rpath,${LIBDIR}"
                        -o "${WORK}/rust_example" "${WORK}/rust_example.rs"
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "rustc failed (${status}):\n${out}${err}")
endif()
execute_process(COMMAND "${WORK}/rust_example" RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "the Rust example failed (${status})")
endif()
