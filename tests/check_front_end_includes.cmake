# The front ends are users of the public API like any other: src/cli includes <ringattn/...>
# and its own cli/ files, python/src <ringattn/...> and its own files; nothing from src/job,
# src/ring, src/single, src/sparse, src/kernels or src/core. Run as
#   cmake -DSOURCE_DIR=<repo> -P tests/check_front_end_includes.cmake
# (ctest: front_end_includes, label cli). Fails naming every include that reaches past it.
set(bad "")
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
  message(FATAL_ERROR "front ends include internal headers:\n  ${text}")
endif()
message(STATUS "front ends include <ringattn/...> and their own files only")
