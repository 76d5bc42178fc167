# Runs the cuflash command once and checks what it did; a CTest test per call.
#   cmake -DCLI=<cuflash> -DARGS="<arguments>" -DEXPECT_EXIT=<code>
#         [-DSTDOUT_HAS="a|b|..."]   every piece must appear in stdout
#         [-DSTDERR_ONE_LINE_HAS=x]  stderr is exactly one line, and it contains x
#         [-DSTDERR_MATCHES=regex]   stderr matches the regular expression
#         [-DMAX_SECONDS=n]          the command ends within n seconds (whole seconds, so give some slack)
#         [-DMAX_OUT_ERROR_BELOW_EXP=-5]  the printed "out max-abs" is below 1e<exp>
#         -P check_cli.cmake
separate_arguments(arguments UNIX_COMMAND "${ARGS}")
string(TIMESTAMP start "%s")
execute_process(COMMAND "${CLI}" ${arguments} RESULT_VARIABLE exit_code OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
set(context "cuflash ${ARGS}\n--- exit code: ${exit_code} after ${seconds} s\n--- stdout:\n${out}--- stderr:\n${err}")

if(DEFINED MAX_SECONDS AND seconds GREATER MAX_SECONDS)
  message(FATAL_ERROR "expected to end within ${MAX_SECONDS} s\n${context}")
endif()

if(NOT exit_code STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT}\n${context}")
endif()

if(DEFINED STDOUT_HAS)
  string(REPLACE "|" ";" pieces "${STDOUT_HAS}")
  foreach(piece IN LISTS pieces)
    string(FIND "${out}" "${piece}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "stdout lacks '${piece}'\n${context}")
    endif()
  endforeach()
endif()

if(DEFINED STDERR_ONE_LINE_HAS)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines line_count)
  string(FIND "${err}" "${STDERR_ONE_LINE_HAS}" at)
  if(NOT line_count EQUAL 1 OR NOT err MATCHES "\n$" OR at EQUAL -1)
    message(FATAL_ERROR "expected exactly one line on stderr naming '${STDERR_ONE_LINE_HAS}'\n${context}")
  endif()
endif()

if(DEFINED STDERR_MATCHES AND NOT err MATCHES "${STDERR_MATCHES}")
  message(FATAL_ERROR "stderr does not match '${STDERR_MATCHES}'\n${context}")
endif()

# Printed as %.2e, so mantissa 1.00..9.99: the value is below 1e<exp> iff its
# exponent is below <exp>, or it is zero.
if(DEFINED MAX_OUT_ERROR_BELOW_EXP)
  if(NOT out MATCHES "out max-abs ([0-9.]+)e([-+][0-9]+)")
    message(FATAL_ERROR "no 'out max-abs' in stdout\n${context}")
  endif()
  set(mantissa "${CMAKE_MATCH_1}")
  math(EXPR exponent "${CMAKE_MATCH_2}")
  if(NOT (mantissa EQUAL 0 OR exponent LESS MAX_OUT_ERROR_BELOW_EXP))
    message(FATAL_ERROR "out max-abs ${mantissa}e${exponent} is not below 1e${MAX_OUT_ERROR_BELOW_EXP}\n${context}")
  endif()
endif()
