# Which architecture's CPU kernels are built (included by CMakeLists.txt
# before the library is defined): src/cpu/<arch>/sources.cmake lists that
# folder's files with their flags. x86-64 builds src/cpu/x86, AArch64
# src/cpu/arm; any other CPU runs the generic table alone. The registry
# (src/cpu/registry.c) compiles in the tables of the architecture it is
# built for.
function(ql_cpu_sources arch flags)
  foreach(f ${ARGN})
    set(path ${CMAKE_SOURCE_DIR}/src/cpu/${arch}/${f})
    list(APPEND QL_CORE_SOURCES ${path})
    if(flags)
      set_source_files_properties(${path} PROPERTIES COMPILE_OPTIONS "${flags}")
    endif()
  endforeach()
  set(QL_CORE_SOURCES ${QL_CORE_SOURCES} PARENT_SCOPE)
endfunction()

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86)$")
  set(QL_ARCH x86)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  set(QL_ARCH arm)
else()
  set(QL_ARCH generic)
endif()
if(QL_ARCH STREQUAL "generic")
  ql_cpu_sources(generic "" features_none.c)
else()
  include(${CMAKE_SOURCE_DIR}/src/cpu/${QL_ARCH}/sources.cmake)
endif()
if(QL_ARCH STREQUAL "arm")
  include(${CMAKE_CURRENT_LIST_DIR}/arm.cmake)
endif()
message(STATUS "qlinear kernels: ${QL_ARCH}")
