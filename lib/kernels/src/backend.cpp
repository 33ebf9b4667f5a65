// BackendScope and backend_description: process-wide setup of Kokkos, OpenBLAS and oneDNN.
//
// What it is: the one place that decides how many threads the CPU libraries may use (one: we run
// one MPI rank per core) and that owns Kokkos' lifetime. What it is not: per-op state; gemm.cpp
// keeps its own thread_local caches. Trade-off: OpenMP (used by Debian's oneDNN) reads
// OMP_NUM_THREADS when it loads, before main(), so we set the thread count through
// omp_set_num_threads found with dlsym instead of linking libgomp into every consumer.
#include <Kokkos_Core.hpp>
#include <cblas.h>
#include <dlfcn.h>

#include <mutex>
#include <sstream>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"

extern "C" void openblas_set_num_threads(int);

namespace hpct::kernels {
namespace detail {
std::string bf16_gemm_description();  // gemm.cpp: how Precision::bf16 GEMMs run on this CPU
}

namespace {
std::mutex g_mutex;
int g_refs = 0;                // live BackendScope objects
bool g_owns_kokkos = false;    // true if we initialised Kokkos (so we finalize it)
bool g_kokkos_finalized = false;

// One thread per rank for OpenMP-threaded libraries (oneDNN) when they are loaded.
void limit_openmp_threads() {
  using SetFn = void (*)(int);
  if (auto fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) fn(1);
}
}  // namespace

BackendScope::BackendScope() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_refs == 0) {
    openblas_set_num_threads(1);
    limit_openmp_threads();
    if (!Kokkos::is_initialized()) {
      // Kokkos 3.x may be initialised again after finalize(); 4.x forbids it: say so clearly
      // rather than abort inside Kokkos.
      if (KOKKOS_VERSION >= 40000 && g_kokkos_finalized)
        throw Error("hpct::kernels::BackendScope: Kokkos was already finalized in this process",
                    Error::Context{"", "", "keep one BackendScope alive for the whole program (e.g. in main)"});
#if KOKKOS_VERSION >= 30700
      Kokkos::initialize(Kokkos::InitializationSettings().set_num_threads(1).set_disable_warnings(true));
#else
      Kokkos::InitArguments args;
      args.num_threads = 1;
      args.disable_warnings = true;
      Kokkos::initialize(args);
#endif
      g_owns_kokkos = true;
    }
  }
  ++g_refs;
}

BackendScope::~BackendScope() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_refs == 0 && g_owns_kokkos) {
    Kokkos::finalize();
    g_owns_kokkos = false;
    g_kokkos_finalized = true;
  }
}

std::string backend_description() {
  std::ostringstream s;
  s << "cpu: Kokkos " << Kokkos::DefaultHostExecutionSpace::name() << " " << KOKKOS_VERSION / 10000 << "."
    << KOKKOS_VERSION / 100 % 100 << "." << KOKKOS_VERSION % 100;
  // openblas_get_config() reads "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64":
  // keep the name and version, and add the kernel set chosen at run time.
  std::istringstream cfg(openblas_get_config());
  std::string name, version;
  cfg >> name >> version;
  const std::string core = openblas_get_corename();
  s << ", " << name << " " << version << " (" << core << " kernels)";
  // OpenBLAS before 0.3.22 does not know Zen 4/5 and falls back to its AVX2 (Haswell/Zen)
  // kernels, half the sgemm speed of its AVX-512 ones on those CPUs. The choice is made when the
  // library loads, so all we can do is say how to fix it.
  if (__builtin_cpu_supports("avx512f") && (core == "Haswell" || core == "Zen"))
    s << " [AVX2 kernels on an AVX-512 CPU: export OPENBLAS_CORETYPE=SkylakeX for ~2x fp32 GEMM]";
  s << ", bf16 GEMM: " << detail::bf16_gemm_description();
  return s.str();
}

}  // namespace hpct::kernels
