# Dispatch tests: the ISA each CPU picks. In the AArch64 cross build each
# qemu CPU model is pinned (QEMU_CPU) with the ISA it must pick, whatever
# model the rest of the suite runs under.
add_executable(test_dispatch tests/test_dispatch.c tests/testutil.c)
target_link_libraries(test_dispatch PRIVATE qlinear_static)
target_include_directories(test_dispatch PRIVATE src tests)
if(CMAKE_CROSSCOMPILING AND QL_ARCH STREQUAL "arm")
  foreach(pair "cortex-a57=neon" "neoverse-n1=neondot" "max=neonbf16")
    string(REPLACE "=" ";" kv "${pair}")
    list(GET kv 0 cpu)
    list(GET kv 1 isa)
    add_test(NAME test_dispatch_${cpu} COMMAND test_dispatch ${isa})
    set_tests_properties(test_dispatch_${cpu} PROPERTIES ENVIRONMENT "QEMU_CPU=${cpu}")
  endforeach()
else()
  add_test(NAME test_dispatch COMMAND test_dispatch)
endif()
