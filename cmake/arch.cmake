# Which architecture's kernels are built (included by CMakeLists.txt before
# the library is defined). x86-64: the per-ISA files named *_avx*.c in
# QL_CORE_SOURCES, each compiled with its own -m flags. Anything else: those
# are left out; AArch64 adds src/arm/ (cmake/arm.cmake), any other CPU runs the
# portable C kernels alone. The C files choose their dispatch tables with the
# matching QL_X86 / QL_ARM64 macros (src/core/core.h).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86)$")
  set(QL_ARCH x86)
else()
  list(FILTER QL_CORE_SOURCES EXCLUDE REGEX "_avx[^/]*\\.c$")
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
    set(QL_ARCH arm64)
    include(${CMAKE_CURRENT_LIST_DIR}/arm.cmake)
  else()
    set(QL_ARCH generic)
  endif()
endif()
message(STATUS "qlinear kernels: ${QL_ARCH}")
