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
