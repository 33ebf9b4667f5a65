# find_package for every dependency. scripts/install_deps.sh installs them on Debian 12.
find_package(MPI REQUIRED COMPONENTS C CXX)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 2.1 REQUIRED CONFIG)  # every app's command line (core/cli.hpp)
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)

# Async IO engine backends: io_uring (liburing-dev) and libaio (libaio-dev; no pkg-config file).
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
# Compressed corpora in preprocess_data (io/text_source.hpp): gzip, zstd, bzip2.
find_package(ZLIB REQUIRED)
find_package(BZip2 REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
# SentencePiece tokenizers (io/sentencepiece_tokenizer.hpp): libsentencepiece-dev.
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# generate's text-generation server (apps/generate/server.cpp): libcpp-httplib-dev.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_library(HPCT_AIO_LIBRARY aio REQUIRED)
find_path(HPCT_AIO_INCLUDE_DIR libaio.h REQUIRED)
add_library(hpct_libaio INTERFACE)
target_link_libraries(hpct_libaio INTERFACE ${HPCT_AIO_LIBRARY})
target_include_directories(hpct_libaio INTERFACE ${HPCT_AIO_INCLUDE_DIR})

set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "hpctrain needs a parallel HDF5 (Debian: libhdf5-openmpi-dev); found a serial one at ${HDF5_INCLUDE_DIRS}")
endif()

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(HPCT_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread)

# Debian's Kokkos (libtrilinos-kokkos-dev) exports an include dir of <prefix>/include, but the
# headers live in <prefix>/include/trilinos: take Kokkos_INCLUDE_DIRS, which is right.
find_package(Kokkos REQUIRED)
if(Kokkos_INCLUDE_DIRS)
  set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${Kokkos_INCLUDE_DIRS}")
endif()

# oneDNN: Debian's dnnl-config.cmake insists on OpenCL (its GPU runtime), which we never use;
# find the library and header directly and wrap them in a target named like upstream's.
if(HPCT_ENABLE_ONEDNN)
  find_library(HPCT_DNNL_LIBRARY dnnl)
  find_path(HPCT_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  if(HPCT_DNNL_LIBRARY AND HPCT_DNNL_INCLUDE_DIR)
    add_library(DNNL::dnnl INTERFACE IMPORTED)
    set_target_properties(DNNL::dnnl PROPERTIES INTERFACE_LINK_LIBRARIES "${HPCT_DNNL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${HPCT_DNNL_INCLUDE_DIR}")
    set(dnnl_VERSION "${HPCT_DNNL_LIBRARY}")
  else()
    message(WARNING "oneDNN not found: bf16 GEMMs round inputs and use the fp32 path (install libdnnl-dev)")
    set(HPCT_ENABLE_ONEDNN OFF)
  endif()
endif()

if(HPCT_ENABLE_CUDA)
  # Hopper (H100/H200) unless the site says otherwise; must be set before enable_language, which
  # otherwise picks the compiler's default architecture.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc 13's C++20 flag; the .cu files need only C++17.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  find_library(HPCT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(HPCT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(NOT HPCT_NCCL_LIBRARY OR NOT HPCT_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "HPCT_ENABLE_CUDA=ON but NCCL was not found next to the CUDA toolkit")
  endif()
  add_library(hpct_nccl INTERFACE)
  target_link_libraries(hpct_nccl INTERFACE ${HPCT_NCCL_LIBRARY})
  target_include_directories(hpct_nccl SYSTEM INTERFACE ${HPCT_NCCL_INCLUDE_DIR})
endif()

# UCX (UCP + UCT, libucx-dev) for ib_healthcheck's direct fabric probes. Optional: without it
# hpct::comm still builds and the UCX checks report that they were not built.
pkg_check_modules(UCX IMPORTED_TARGET ucx)
if(UCX_FOUND)
  message(STATUS "  [x] UCX ${UCX_VERSION} (ib_healthcheck UCP probes)")
else()
  message(STATUS "  [ ] UCX not found (ib_healthcheck UCP probes disabled; Debian: libucx-dev)")
endif()
