// ib_healthcheck — tests every node and link of an allocation before a training run depends on
// them, names the bad ones, and can drain them in Slurm. Thin: parse, load the profile, run.
// Exit codes: 0 healthy, 1 unhealthy, 2 could not run (see --help and docs/healthcheck.md).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hpct/core/report.hpp"
#include "healthcheck.hpp"
#include "hpct/comm/mpi.hpp"

using namespace hpct;
using namespace hpct::healthcheck;

// Before MPI starts, only the launcher tells which rank we are: print usage errors once.
static int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  return 0;
}

int main(int argc, char** argv) {
  if (hpct::print_version_if_asked("ib_healthcheck", argc, argv)) return 0;
  const bool print = launcher_rank() == 0;
  Options o;
  Profile p;
  try {
    o = parse_args(std::vector<std::string>(argv + 1, argv + argc));
    if (o.help) {
      if (print) std::fputs(help_text().c_str(), stdout);
      return kExitHealthy;
    }
    p = load_profile(o.profile);
    apply_overrides(o, p);
    if (o.node_local) return run_node_local(o, p);
  } catch (const Error& e) {
    if (print) std::fprintf(stderr, "ib_healthcheck: error: %s\n", e.what());
    return kExitCouldNotRun;
  }
  // MPI_THREAD_SINGLE unless NCCL's checks run (NCCL's proxy threads make the process
  // multi-threaded): Open MPI 4.1 locks every call from FUNNELED up, which the latency probes
  // would measure (docs/healthcheck.md).
  bool nccl = false;
  for (const auto& c : selected_checks(o, p)) nccl = nccl || c.rfind("nccl_", 0) == 0;
  comm::Environment env(&argc, &argv, nccl ? comm::Threads::funneled : comm::Threads::single);
  try {
    return run_allocation(o, p);
  } catch (const SilentPeer& e) {
    std::fprintf(stderr, "ib_healthcheck: error: %s\n", e.what());
    comm::Environment::abort(kExitUnhealthy);
  } catch (const Error& e) {
    // Setup errors (duplicate node names, a fault on a rank that does not exist) are found alike
    // on every rank: print once and return. Anything else may be one rank's alone: end the job.
    if (e.context().key == "ranks" || e.context().key == "--inject-fault") {
      if (comm::Communicator::world().rank() == 0) std::fprintf(stderr, "ib_healthcheck: error: %s\n", e.what());
      return kExitCouldNotRun;
    }
    std::fprintf(stderr, "ib_healthcheck: error: %s\n", e.what());
    comm::Environment::abort(kExitCouldNotRun);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ib_healthcheck: error: [rank %d] %s\n", comm::Communicator::world().rank(), e.what());
    comm::Environment::abort(kExitCouldNotRun);
  }
}
