// ib_healthcheck options: the command line as a typed struct, parsed without MPI (so usage errors
// and the node-local mode never need a launcher). Values the profile also sets (sizes, timeout,
// rounds) stay unset here unless given, and the profile's values fill them in (config.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hpct::healthcheck {

/// The fabric checks, in the order they run; "node" (node-local) always runs first.
/// In the order they run. The nccl_ ones (device buffers, CUDA builds) are in the default set only
/// when the profile expects GPUs.
inline const std::vector<std::string> kAllChecks = {"node",     "mpi_p2p",        "ucx_p2p",
                                                    "allreduce", "alltoall",      "nccl_allreduce",
                                                    "nccl_alltoall"};

/// Fault injection, for tests only: make one rank misbehave in one check.
struct Fault {
  enum class Kind { slow, lossy, hang, die, freeze };
  Kind kind = Kind::slow;
  int rank = -1;
  std::string check;     // one of kAllChecks except "node"
  double factor = 20.0;  // slow: each timed operation of that rank takes factor x as long
};

struct Options {
  bool help = false;
  std::string profile;                  // file, or a name looked up in inputs/healthcheck/
  std::vector<std::string> checks;      // empty = all
  bool node_local = false;              // node checks only, no MPI (Slurm HealthCheckProgram)
  std::optional<uint64_t> lat_size, bw_size, min_size, max_size;
  std::optional<double> timeout_s;
  std::optional<int> rounds;
  int lat_iters = 1000;                 // ping-pongs per pair (after 10% warm-up)
  int bw_iters = 20;                    // windows per direction at the bandwidth size
  int window = 16;                      // messages in flight per window (OSU uses 64)
  int coll_iters = 20;                  // most iterations per collective size
  std::string json_file;
  std::string exclude_file;
  bool drain = false;                   // print scontrol commands for failed nodes
  bool drain_execute = false;           // and run them
  bool quiet = false;                   // no progress lines
  bool emulate_nodes = false;           // tests: rank r is node "node<r>"
  std::vector<Fault> faults;            // tests: --inject-fault
};

/// Parses argv (without argv[0]); throws hpct::Error naming the flag on bad input.
Options parse_args(const std::vector<std::string>& args);
std::string help_text();
/// Text of a fault, as on the command line ("slow:3:mpi_p2p:20").
std::string describe(const Fault& f);

/// Exit codes (documented in --help and docs/healthcheck.md).
inline constexpr int kExitHealthy = 0;
inline constexpr int kExitUnhealthy = 1;
inline constexpr int kExitCouldNotRun = 2;

}  // namespace hpct::healthcheck
