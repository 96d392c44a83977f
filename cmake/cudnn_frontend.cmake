# ringattn_find_cudnn_frontend(<include_var> <reason_var>): the include directory of NVIDIA's
# cudnn-frontend (header-only graph API), or, in <reason_var>, why there is none. The headers
# come from the pinned PyPI release (they sit under include/ in every wheel of it, whatever
# its Python tag), fetched with `pip download` once per build directory; an offline machine
# points RINGATTN_CUDNN_FRONTEND_INCLUDE at a directory holding cudnn_frontend.h instead.
set(RINGATTN_CUDNN_FRONTEND_PYPI "nvidia-cudnn-frontend==1.32.0" CACHE STRING
  "The PyPI release whose C++ headers the cuDNN graphs are built with")
set(RINGATTN_CUDNN_FRONTEND_INCLUDE "" CACHE PATH
  "Offline override: a directory with cudnn_frontend.h (skips the download)")

function(ringattn_find_cudnn_frontend include_var reason_var)
  set(${reason_var} "" PARENT_SCOPE)
  if(RINGATTN_CUDNN_FRONTEND_INCLUDE)
    if(NOT EXISTS "${RINGATTN_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend.h")
      message(FATAL_ERROR "RINGATTN_CUDNN_FRONTEND_INCLUDE=${RINGATTN_CUDNN_FRONTEND_INCLUDE} "
                          "has no cudnn_frontend.h")
    endif()
    set(${include_var} "${RINGATTN_CUDNN_FRONTEND_INCLUDE}" PARENT_SCOPE)
    return()
  endif()
  set(root ${PROJECT_BINARY_DIR}/cudnn_frontend)
  set(include ${root}/include)
  set(${include_var} ${include} PARENT_SCOPE)
  if(EXISTS ${include}/cudnn_frontend.h)
    return()
  endif()
  find_package(Python3 COMPONENTS Interpreter)
  if(NOT Python3_Interpreter_FOUND)
    set(${reason_var} "no Python 3 to run pip download ${RINGATTN_CUDNN_FRONTEND_PYPI}"
      PARENT_SCOPE)
    return()
  endif()
  file(REMOVE_RECURSE ${root})
  message(STATUS "ringattn: fetching cudnn-frontend headers "
                 "(pip download ${RINGATTN_CUDNN_FRONTEND_PYPI})")
  # One fixed wheel (the headers are the same in all of them), so that any interpreter
  # fetches the same file.
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -m pip download --no-deps --no-cache-dir
            --disable-pip-version-check --timeout 20 --retries 1 --only-binary=:all:
            --python-version 3.11 --platform manylinux_2_28_x86_64 -d ${root}/wheel
            ${RINGATTN_CUDNN_FRONTEND_PYPI}
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err TIMEOUT 240)
  file(GLOB wheel ${root}/wheel/*.whl)
  if(NOT rc EQUAL 0 OR NOT wheel)
    string(STRIP "${err}" err)
    string(REGEX REPLACE ".*\n" "" last_line "${err}")
    set(${reason_var} "pip download ${RINGATTN_CUDNN_FRONTEND_PYPI} failed (${rc}): ${last_line}"
      PARENT_SCOPE)
    return()
  endif()
  file(ARCHIVE_EXTRACT INPUT ${wheel} DESTINATION ${root} PATTERNS "include/*")
  file(REMOVE_RECURSE ${root}/wheel)
  if(NOT EXISTS ${include}/cudnn_frontend.h)
    set(${reason_var} "${RINGATTN_CUDNN_FRONTEND_PYPI} has no include/cudnn_frontend.h"
      PARENT_SCOPE)
  endif()
endfunction()
