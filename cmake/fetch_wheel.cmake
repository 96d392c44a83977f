# ringattn_fetch_wheel_files(<spec> <root> <reason_var> PATTERNS <glob>... [PIP_ARGS <arg>...]):
# `pip download <spec>` (one pinned PyPI release, no dependencies) into <root>/wheel, and the
# files matching the patterns extracted under <root>. On failure <reason_var> says why (the
# last line of pip's error); on success it is empty. Header-only libraries made for the field
# (CuTe, cudnn-frontend) come this way, once per build directory.
function(ringattn_fetch_wheel_files spec root reason_var)
  cmake_parse_arguments(F "" "" "PATTERNS;PIP_ARGS" ${ARGN})
  set(${reason_var} "" PARENT_SCOPE)
  find_package(Python3 COMPONENTS Interpreter)
  if(NOT Python3_Interpreter_FOUND)
    set(${reason_var} "no Python 3 to run pip download ${spec}" PARENT_SCOPE)
    return()
  endif()
  file(REMOVE_RECURSE ${root})
  message(STATUS "ringattn: fetching headers (pip download ${spec})")
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -m pip download --no-deps --no-cache-dir
            --disable-pip-version-check --timeout 20 --retries 1 ${F_PIP_ARGS} -d ${root}/wheel
            ${spec}
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err TIMEOUT 240)
  file(GLOB wheel ${root}/wheel/*.whl)
  if(NOT rc EQUAL 0 OR NOT wheel)
    string(STRIP "${err}" err)
    string(REGEX REPLACE ".*\n" "" last_line "${err}")
    set(${reason_var} "pip download ${spec} failed (${rc}): ${last_line}" PARENT_SCOPE)
    return()
  endif()
  file(ARCHIVE_EXTRACT INPUT ${wheel} DESTINATION ${root} PATTERNS ${F_PATTERNS})
  file(REMOVE_RECURSE ${root}/wheel)
endfunction()
