# AArch64 kernels (src/arm). Each ISA level's file gets its own -march, so the
# library runs on any ARMv8-A CPU and dispatches at run time (src/core/cpu.c);
# the prologue, epilogues and fp32 kernel use only ARMv8.0 Advanced SIMD, the
# bf16 kernel FEAT_BF16.
set(QL_ARM_SOURCES
  src/arm/ukernel_neon.c src/arm/ukernel_neondot.c src/arm/ukernel_i8mm.c
  src/arm/prologue_neon.c src/arm/epilogue_neon.c src/arm/f32_neon.c src/arm/bf16_neonbf16.c)
list(APPEND QL_CORE_SOURCES ${QL_ARM_SOURCES})
# GCC's pre-allocation scheduler hoists every load and product of an unrolled
# k step ahead of its accumulations and then spills accumulators (seen in the
# disassembly of the NEON and SMMLA loops); without it the loops keep every
# accumulator in a register.
set(QL_ARM_KFLAGS)
if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
  set(QL_ARM_KFLAGS -fno-schedule-insns)
endif()
set_source_files_properties(src/arm/ukernel_neon.c src/arm/f32_neon.c PROPERTIES COMPILE_OPTIONS "${QL_ARM_KFLAGS}")
set_source_files_properties(src/arm/ukernel_neondot.c PROPERTIES COMPILE_OPTIONS "-march=armv8.2-a+dotprod;${QL_ARM_KFLAGS}")
set_source_files_properties(src/arm/ukernel_i8mm.c PROPERTIES COMPILE_OPTIONS "-march=armv8.2-a+dotprod+i8mm;${QL_ARM_KFLAGS}")
set_source_files_properties(src/arm/bf16_neonbf16.c PROPERTIES COMPILE_OPTIONS "-march=armv8.2-a+bf16;${QL_ARM_KFLAGS}")
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
