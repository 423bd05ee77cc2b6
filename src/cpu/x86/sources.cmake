# The x86 kernels: each file compiled with the flags of its ISA (nothing else
# is built for a newer ISA, so the library runs on any x86-64 CPU and picks a
# table at run time). The tables (table_*.c) and feature detection are plain C.
ql_cpu_sources(x86 ""
  features_x86.c table_avx2.c table_avxvnni.c table_avx512vnni.c table_avx512bf16.c table_amx.c)
ql_cpu_sources(x86 "-mavx2;-mfma;-mf16c"
  ukernel_avx2.c f32_avx2.c prologue_avx2.c epilogue_avx2.c input_act_avx2.c wxa8_decode_avx2.c)
ql_cpu_sources(x86 "-mavx2;-mfma;-mf16c;-mavxvnni"
  ukernel_avxvnni.c)
ql_cpu_sources(x86 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16;-mfma;-mf16c"
  ukernel_avx512vnni.c f32_avx512.c prologue_avx512.c epilogue_avx512.c lora_avx512.c stochastic_avx512.c
  wxa8_decode_avx512.c input_act_avx512.c)
# the VDPBF16PS kernels (their int8 -> bf16 decode: VPERMB, VPERMI2B)
ql_cpu_sources(x86 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mavx512vbmi;-mfma"
  bf16_avx512bf16.c)
# W6A8 packed panels decoded by VPERMB (called only where the CPU has VBMI)
ql_cpu_sources(x86 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512vbmi"
  wxa8_decode6_avx512vbmi.c)
# the AMX tiles (GCC 11 or newer); the table's other entries are the AVX-512 files'
ql_cpu_sources(x86 "-mamx-tile;-mamx-int8;-mavx512f;-mavx512bw;-mavx512vl;-mavx512vnni"
  ukernel_amx.c)
# the AMX-BF16 float kernels (TDPBF16PS; their int8 -> bf16 decode: VPERMB, VPERMI2B)
ql_cpu_sources(x86 "-mamx-tile;-mamx-bf16;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vbmi"
  bf16_amx.c)
# the LoRA merge's low-rank add, vectorized by the compiler at each width
ql_cpu_sources(x86 "-mavx2" lowrank_avx2.c)
ql_cpu_sources(x86 "-mavx512f" lowrank_avx512.c)
