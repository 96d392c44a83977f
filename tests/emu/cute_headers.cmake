# ringattn_fetch_cute_headers(<include_var> <skip_reason_var>): the include directories for
# CuTe (the CUTLASS headers of the nvidia-cutlass wheel, and libcu++ from the CUDA toolkit),
# or, in <skip_reason_var>, why they are not available. The wheel is fetched with
# `pip download` once per build directory.
include(${PROJECT_SOURCE_DIR}/cmake/fetch_wheel.cmake)

set(RINGATTN_CUTLASS_PYPI "nvidia-cutlass==4.2.0.0" CACHE STRING
  "The PyPI release whose CuTe headers the emulator's fragment layouts are checked against")

function(ringattn_fetch_cute_headers include_var reason_var)
  set(root ${CMAKE_CURRENT_BINARY_DIR}/cutlass)
  set(include ${root}/cutlass_library/source/include)
  set(${reason_var} "" PARENT_SCOPE)
  # CuTe includes <cuda/std/...> even on the host: libcu++, part of the toolkit's CCCL.
  find_path(RINGATTN_CCCL_INCLUDE cuda/std/utility
    HINTS ${CUDAToolkit_INCLUDE_DIRS}/cccl
    PATHS /usr/local/cuda/include/cccl /usr/local/cuda/targets/x86_64-linux/include/cccl
          /usr/local/cuda/targets/sbsa-linux/include/cccl)
  if(NOT RINGATTN_CCCL_INCLUDE)
    set(${reason_var} "CuTe needs libcu++ (<cuda/std/utility>, the CUDA toolkit's CCCL headers)"
      PARENT_SCOPE)
    return()
  endif()
  set(${include_var} ${include} ${RINGATTN_CCCL_INCLUDE} PARENT_SCOPE)
  if(EXISTS ${include}/cute/atom/mma_traits_sm80.hpp)
    return()
  endif()

  ringattn_fetch_wheel_files(${RINGATTN_CUTLASS_PYPI} ${root} fetch_failed
    PATTERNS "cutlass_library/source/include/cute/*" "cutlass_library/source/include/cutlass/*")
  if(fetch_failed)
    set(${reason_var} "${fetch_failed}" PARENT_SCOPE)
    return()
  endif()
  if(NOT EXISTS ${include}/cute/atom/mma_traits_sm80.hpp)
    set(${reason_var} "${RINGATTN_CUTLASS_PYPI} has no cute/atom/mma_traits_sm80.hpp" PARENT_SCOPE)
  endif()
endfunction()
