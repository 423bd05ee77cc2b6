# Checkpoint files: safetensors reader/writer, comfy_quant layers, checkpoint
# quantization (src/format), their tests and the reader's fuzz target.
# Included at the end of the top-level CMakeLists.txt.

find_path(QL_JANSSON_INCLUDE jansson.h)
find_library(QL_JANSSON_LIB jansson REQUIRED)

set(QL_FORMAT_SOURCES
  src/format/text.c
  src/format/safetensors.c
  src/format/checkpoint.c
  src/format/writer.c
  src/format/comfy_quant.c
  src/format/layers.c
  src/format/quantize_ckpt.c
  src/format/lora_file.c
  src/format/merge_lora.c)

target_sources(qlinear_objs PRIVATE ${QL_FORMAT_SOURCES})
if(QL_JANSSON_INCLUDE)
  target_include_directories(qlinear_objs PRIVATE ${QL_JANSSON_INCLUDE})
  target_include_directories(qlinear PRIVATE ${QL_JANSSON_INCLUDE}) # the tool reads JSON too
  include_directories(${QL_JANSSON_INCLUDE})                         # and the format tests below
endif()
target_link_libraries(qlinear_objs PUBLIC ${QL_JANSSON_LIB})
target_link_libraries(qlinear_static PUBLIC ${QL_JANSSON_LIB})
target_link_libraries(qlinear_shared PRIVATE ${QL_JANSSON_LIB})

if(QL_BUILD_TESTS)
  # Library-level tests: reader rules, hostile files, writer bytes, layers,
  # quantize round trip (seeded; QL_TEST_SEED overrides the seed).
  add_executable(test_format tests/test_format.c tests/test_format_cases.c tests/testutil.c)
  target_link_libraries(test_format PRIVATE qlinear_static)
  target_include_directories(test_format PRIVATE src tests)
  add_test(NAME test_format COMMAND test_format)
  # Rewrites shared/golden/*.safetensors (made by the Python reference
  # writer) and expects the same bytes; skipped when the folder is absent.
  set_tests_properties(test_format PROPERTIES ENVIRONMENT "QL_SHARED_DIR=${QL_SHARED_DIR}")

  # The qlinear command on the same files: one error line, exit codes.
  add_executable(test_format_cli tests/test_format_cli.c tests/test_format_cases.c tests/testutil.c)
  target_link_libraries(test_format_cli PRIVATE qlinear_static)
  target_include_directories(test_format_cli PRIVATE src tests)
  add_test(NAME test_format_cli COMMAND test_format_cli ${CMAKE_CROSSCOMPILING_EMULATOR} $<TARGET_FILE:qlinear>)
  add_dependencies(test_format_cli qlinear)

  # LoRA files, merging, stochastic rounding, merge-lora / forward --lora.
  add_executable(test_merge tests/test_merge.c tests/testutil.c)
  target_link_libraries(test_merge PRIVATE qlinear_static)
  target_include_directories(test_merge PRIVATE src tests)
  add_test(NAME test_merge COMMAND test_merge ${CMAKE_CROSSCOMPILING_EMULATOR} $<TARGET_FILE:qlinear>)
  add_dependencies(test_merge qlinear)
endif()

if(QL_BUILD_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "QL_BUILD_FUZZ needs clang (configure with CC=clang)")
  endif()
  # Coverage instrumentation for the code under test; the fuzzer links it.
  set_source_files_properties(${QL_FORMAT_SOURCES} PROPERTIES COMPILE_OPTIONS "-fsanitize=fuzzer-no-link")
  # fuzz_checkpoint: the container; fuzz_layers: the comfy layer parser;
  # fuzz_lora: the LoRA file reader (the last two repair their input into a
  # well-formed container first, fuzz/fuzz_st.h).
  foreach(target fuzz_checkpoint fuzz_layers fuzz_lora)
    add_executable(${target} fuzz/${target}.c)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${target} PRIVATE qlinear_static)
    target_include_directories(${target} PRIVATE src fuzz)
  endforeach()

  add_executable(fuzz_make_seeds fuzz/make_seeds.c)
  target_link_libraries(fuzz_make_seeds PRIVATE qlinear_static)
  target_include_directories(fuzz_make_seeds PRIVATE src fuzz)
endif()
