# ringattn_find_cudnn_frontend(<include_var> <reason_var>): the include directory of NVIDIA's
# cudnn-frontend (header-only graph API), or, in <reason_var>, why there is none. The headers
# come from the pinned PyPI release (they sit under include/ in every wheel of it, whatever
# its Python tag), fetched with `pip download` once per build directory; an offline machine
# points RINGATTN_CUDNN_FRONTEND_INCLUDE at a directory holding cudnn_frontend.h instead.
include(${CMAKE_CURRENT_LIST_DIR}/fetch_wheel.cmake)

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
  # One fixed wheel (the headers are the same in all of them), so that any interpreter
  # fetches the same file.
  ringattn_fetch_wheel_files(${RINGATTN_CUDNN_FRONTEND_PYPI} ${root} fetch_failed
    PATTERNS "include/*"
    PIP_ARGS --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64)
  if(fetch_failed)
    set(${reason_var} "${fetch_failed}" PARENT_SCOPE)
    return()
  endif()
  if(NOT EXISTS ${include}/cudnn_frontend.h)
    set(${reason_var} "${RINGATTN_CUDNN_FRONTEND_PYPI} has no include/cudnn_frontend.h"
      PARENT_SCOPE)
  endif()
endfunction()
