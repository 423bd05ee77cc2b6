# AArch64 build settings beside the kernels (src/cpu/arm/sources.cmake):
# test compile flags and the sanitizer runtimes of the cross build.
# Debian's aarch64 GCC 12 stops with an internal compiler error in the loop
# vectorizer (vect_transform_reduction) on float64 reductions of some tests
# (test_merge.c, test_wxa8.c) at -O3; the tests' own arithmetic does not need
# vectorizing, so no test file gets it.
if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
  file(GLOB QL_TEST_C_FILES ${CMAKE_SOURCE_DIR}/tests/*.c)
  set_source_files_properties(${QL_TEST_C_FILES} PROPERTIES COMPILE_OPTIONS "-fno-tree-vectorize")
endif()
# ASan + UBSan in the cross build (-DQL_SANITIZE=ON): GCC's runtimes linked
# statically (libasan8-arm64-cross installs them under /usr/aarch64-linux-gnu,
# which the tests' qemu does not search); ASan's shadow memory works under
# qemu-user.
if(QL_SANITIZE AND CMAKE_CROSSCOMPILING AND CMAKE_C_COMPILER_ID STREQUAL "GNU")
  add_link_options(-static-libasan -static-libubsan)
endif()
