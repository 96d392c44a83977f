# The front ends are users of the public API like any other: src/cli includes <ringattn/...>
# and its own cli/ files, python/src <ringattn/...> and its own files; nothing from src/job,
# src/ring, src/single, src/sparse, src/kernels or src/core. Run as
#   cmake -DSOURCE_DIR=<repo> -P tests/check_front_end_includes.cmake
# (ctest: front_end_includes, label cli). Fails naming every include that reaches past it.
# It also checks that the library's layers only look down: core, kernels, single, ring,
# sparse, job (docs/ARCHITECTURE.md), each including only the ones before it.
set(bad "")
set(layers core kernels single ring sparse job cli)
list(LENGTH layers count)
math(EXPR last "${count} - 2")
foreach(i RANGE ${last})
  list(GET layers ${i} layer)
  math(EXPR next "${i} + 1")
  list(SUBLIST layers ${next} -1 higher)
  list(JOIN higher "|" above)
  file(GLOB_RECURSE files "${SOURCE_DIR}/src/${layer}/*.cpp" "${SOURCE_DIR}/src/${layer}/*.hpp"
       "${SOURCE_DIR}/src/${layer}/*.cu" "${SOURCE_DIR}/src/${layer}/*.cuh")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"(${above})/")
    foreach(line IN LISTS lines)
      list(APPEND bad "${f}: ${line} (the ${layer} layer looks up)")
    endforeach()
  endforeach()
endforeach()
foreach(dir IN ITEMS src/cli python/src)
  file(GLOB files "${SOURCE_DIR}/${dir}/*.cpp" "${SOURCE_DIR}/${dir}/*.hpp"
       "${SOURCE_DIR}/${dir}/*.ipp")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" name "${line}")
      if(name MATCHES "^(job|ring|single|sparse|kernels|core|emu)/")
        list(APPEND bad "${f}: ${name}")
      elseif(dir STREQUAL "src/cli" AND line MATCHES "\"" AND NOT name MATCHES "^(ringattn|cli)/")
        list(APPEND bad "${f}: ${name}")
      endif()
    endforeach()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "includes that reach past the public API or up a layer:\n  ${text}")
endif()
message(STATUS "front ends include <ringattn/...> and their own files only; layers look down")
