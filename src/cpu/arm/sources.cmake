# The AArch64 kernels. Each ISA level's file gets its own -march, so the
# library runs on any ARMv8-A CPU and picks a table at run time; the
# prologue, epilogues and fp32 kernel use only ARMv8.0 Advanced SIMD, the
# bf16 kernel FEAT_BF16.
# GCC's pre-allocation scheduler hoists every load and product of an unrolled
# k step ahead of its accumulations and then spills accumulators (seen in the
# disassembly of the NEON and SMMLA loops); without it the loops keep every
# accumulator in a register.
set(QL_ARM_KFLAGS)
if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
  set(QL_ARM_KFLAGS -fno-schedule-insns)
endif()
ql_cpu_sources(arm ""
  features_arm.c table_neon.c table_neondot.c table_i8mm.c table_neonbf16.c prologue_neon.c epilogue_neon.c
  input_act_neon.c)
ql_cpu_sources(arm "${QL_ARM_KFLAGS}" ukernel_neon.c f32_neon.c)
ql_cpu_sources(arm "-march=armv8.2-a+dotprod;${QL_ARM_KFLAGS}" ukernel_neondot.c)
ql_cpu_sources(arm "-march=armv8.2-a+dotprod+i8mm;${QL_ARM_KFLAGS}" ukernel_i8mm.c)
ql_cpu_sources(arm "-march=armv8.2-a+bf16;${QL_ARM_KFLAGS}" bf16_neonbf16.c)
