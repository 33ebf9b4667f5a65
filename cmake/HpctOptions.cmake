# Every build option of hpctrain, in one place.
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_hpct_cuda_default ON)
else()
  set(_hpct_cuda_default OFF)
endif()
option(HPCT_ENABLE_CUDA "Build the CUDA backend (kernels, NCCL); default ON when nvcc is found" ${_hpct_cuda_default})
option(HPCT_ENABLE_ONEDNN "Use oneDNN for bf16 GEMMs (AVX512-BF16 / AMX)" ON)
option(HPCT_BUILD_TESTS "Build the CTest suite" ON)
option(HPCT_NATIVE "Compile with -march=native (the build machine's vector units)" ON)
set(HPCT_MPIEXEC_EXTRA_FLAGS "" CACHE STRING "Extra flags for mpiexec in tests (e.g. --allow-run-as-root)")
# Open MPI refuses to start as root unless told; CI and containers often run as root.
execute_process(COMMAND id -u OUTPUT_VARIABLE _hpct_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_hpct_uid STREQUAL "0" AND NOT HPCT_MPIEXEC_EXTRA_FLAGS)
  set(HPCT_MPIEXEC_EXTRA_FLAGS "--allow-run-as-root" CACHE STRING "" FORCE)
endif()
set(HPCT_DATA_DIR "${PROJECT_SOURCE_DIR}/data" CACHE PATH "Where scripts/fetch_data.sh put the default data")
# OpenBLAS 0.3.21 does not recognise every AVX-512 CPU (e.g. AMD Zen 5) and falls back to its AVX2
# kernels at half the fp32 GEMM speed; OPENBLAS_CORETYPE=SkylakeX selects the AVX-512 ones. Only
# where the CPU has AVX-512F, and never over a user's own setting. Tests get it through their
# environment; scripts/env.sh does the same for the launch scripts.
set(HPCT_TEST_OPENBLAS_ENV "")
if(EXISTS /proc/cpuinfo AND NOT DEFINED ENV{OPENBLAS_CORETYPE})
  file(STRINGS /proc/cpuinfo _hpct_avx512 REGEX "^flags.* avx512f" LIMIT_COUNT 1)
  if(_hpct_avx512)
    set(HPCT_TEST_OPENBLAS_ENV "OPENBLAS_CORETYPE=SkylakeX")
  endif()
endif()
# Sanitizer and fuzzing builds (scripts/sanitize.sh; docs/reliability.md). HPCT_SANITIZE compiles
# everything with AddressSanitizer and UndefinedBehaviorSanitizer (UB is fatal); HPCT_FUZZ (Clang
# only) instruments for libFuzzer and builds the fuzz targets of tests/fuzz.
option(HPCT_SANITIZE "Build with -fsanitize=address,undefined" OFF)
option(HPCT_FUZZ "Build the libFuzzer targets (Clang; implies HPCT_SANITIZE)" OFF)
set(HPCT_FUZZ_SECONDS 30 CACHE STRING "How long each fuzz target runs under ctest -L fuzz")
# The sanitizer tree runs no test under mpiexec (Open MPI keeps its allocations to exit), so
# scripts/sanitize.sh turns these off: the test executables only MPI runs use are not built there.
option(HPCT_MPI_TESTS "Register (and build the executables of) the tests that run under mpiexec" ON)
if(HPCT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "HPCT_FUZZ needs Clang (libFuzzer): configure with CC=clang CXX=clang++")
  endif()
  set(HPCT_SANITIZE ON CACHE BOOL "" FORCE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
if(HPCT_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=undefined>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()
# Clang before 15 converts __fp16 (kernels::ieee_half there) through compiler-rt's builtins
# (__gnu_f2h_ieee) where the code is not built for F16C: link them in after libgcc.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 15)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} --rtlib=compiler-rt -print-libgcc-file-name
                  OUTPUT_VARIABLE _hpct_rt_builtins OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(EXISTS "${_hpct_rt_builtins}")
    link_libraries(${_hpct_rt_builtins})
  endif()
endif()
