# The fuzz build (TANDEM_FUZZ=ON; tests/fuzz/run.sh): clang only. Every
# target is compiled with AddressSanitizer, UndefinedBehaviorSanitizer
# (any finding aborts, so libFuzzer records it as a crash) and libFuzzer's
# coverage instrumentation; the fuzz programs in tests/fuzz link libFuzzer's
# main. Optimised lightly (-O1) with line tables for the stack traces, and
# assertions on (no NDEBUG). CUDA, the compute core, the normal tests and
# the benchmarks are off: the fuzz targets need none of them.
include_guard(GLOBAL)

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "TANDEM_FUZZ=ON needs clang (libFuzzer): configure with "
    "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++, as tests/fuzz/run.sh does")
endif()
set(TANDEM_ENABLE_CUDA OFF CACHE BOOL "Build CUDA code (off in the fuzz build)" FORCE)
set(TANDEM_BUILD_TESTS OFF CACHE BOOL "Build tests (off in the fuzz build)" FORCE)
set(TANDEM_BUILD_BENCH OFF CACHE BOOL "Build benchmarks (off in the fuzz build)" FORCE)

if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Fuzz CACHE STRING "Build type" FORCE)
endif()
set(CMAKE_C_FLAGS_FUZZ "-O1 -gline-tables-only")
set(CMAKE_CXX_FLAGS_FUZZ "-O1 -gline-tables-only")

set(TANDEM_SANITIZERS -fsanitize=address,undefined -fno-sanitize-recover=all)
add_compile_options(${TANDEM_SANITIZERS} -fsanitize=fuzzer-no-link -fno-omit-frame-pointer)
add_link_options(${TANDEM_SANITIZERS})
