# What `cmake --install` puts in the prefix: the public headers (include/ringattn), the static
# library as ringattn::ringattn (with ringattn_cuda beside it when CUDA is built), the CLI, and
# a relocatable ringattnConfig.cmake that finds the library's own dependencies again with
# find_dependency. Components: "development" (headers, library, CMake files) and "runtime"
# (the CLI); the Python wheel installs only its own component ("python").
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The emulated build's targets (the SIMT emulator) are test scaffolding, not a package.
if(RINGATTN_CUDA_EMULATION)
  return()
endif()

set_target_properties(ringattn_lib PROPERTIES EXPORT_NAME ringattn OUTPUT_NAME ringattn)
# Consumers inside this project may spell it as an installed consumer does.
add_library(ringattn::ringattn ALIAS ringattn_lib)

set(ringattn_export_targets ringattn_lib)
if(TARGET ringattn_cuda)
  set_target_properties(ringattn_cuda PROPERTIES EXPORT_NAME cuda_kernels)
  list(APPEND ringattn_export_targets ringattn_cuda)
endif()

install(TARGETS ${ringattn_export_targets} EXPORT ringattnTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ringattn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
# ringattn/mpi.hpp (mpi_comm) only where the library has the MPI communicator.
if(RINGATTN_HAVE_MPI)
  set(ringattn_header_excludes "")
else()
  set(ringattn_header_excludes PATTERN "mpi.hpp" EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ringattn
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development ${ringattn_header_excludes})

set(ringattn_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ringattn)
install(EXPORT ringattnTargets NAMESPACE ringattn:: DESTINATION ${ringattn_cmake_dir}
  COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ringattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ringattnConfig.cmake INSTALL_DESTINATION ${ringattn_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ringattnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ringattnConfig.cmake
  ${PROJECT_BINARY_DIR}/ringattnConfigVersion.cmake
  DESTINATION ${ringattn_cmake_dir} COMPONENT development)
