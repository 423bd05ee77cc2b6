# Cross build for 64-bit ARM Linux on Debian: gcc-aarch64-linux-gnu (default)
# or clang (-DQL_CROSS_CC=clang), libraries from the arm64 multiarch packages
# (libjansson-dev:arm64). Tests and any program the build runs go through
# qemu-user, named here because binfmt_misc is not mounted on these machines.
# The CPU model is qemu's default (max) unless QEMU_CPU is set when ctest
# runs (QEMU_CPU=cortex-a57 ctest ...), or -DQL_QEMU_CPU=... fixes it.
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(QL_CROSS_CC gcc CACHE STRING "cross compiler: gcc (aarch64-linux-gnu-gcc) or clang (--target=aarch64-linux-gnu)")
if(QL_CROSS_CC STREQUAL "clang")
  set(CMAKE_C_COMPILER clang)
  set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
else()
  set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
endif()
set(QL_QEMU_CPU "" CACHE STRING "qemu -cpu model for the tests (empty: QEMU_CPU from the environment, else max)")
# The programs load the arm64 multiarch libraries (libc6:arm64, libgomp1:arm64,
# libjansson4:arm64 under /lib/aarch64-linux-gnu). Not -L /usr/aarch64-linux-gnu:
# under that prefix qemu 7.2 hangs in the guest's first pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
if(QL_QEMU_CPU)
  list(APPEND CMAKE_CROSSCOMPILING_EMULATOR -cpu ${QL_QEMU_CPU})
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
