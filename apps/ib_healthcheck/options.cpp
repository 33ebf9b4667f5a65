// Command-line parsing for ib_healthcheck: short and long flags, sizes with suffixes, one-line errors.
#include "options.hpp"

#include <algorithm>
#include <cstdlib>

#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"

namespace hpct::healthcheck {
namespace {

int parse_int(const std::string& v, const std::string& flag, int lo) {
  return static_cast<int>(cli::to_int(flag, v, lo, 1000000000));
}

double parse_seconds(const std::string& v, const std::string& flag) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x > 0) || x > 86400)
    throw config_error(flag, "'" + v + "' is not a number of seconds in (0, 86400]");
  return x;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

Fault parse_fault(const std::string& spec) {
  const std::string flag = "--inject-fault";
  const std::string hint = "write KIND:RANK:CHECK[:FACTOR], KIND one of slow, lossy, hang, die, freeze; CHECK one of "
                           "mpi_p2p, ucx_p2p, allreduce, alltoall, nccl_allreduce, nccl_alltoall";
  auto parts = split(spec, ':');
  if (parts.size() < 3 || parts.size() > 4) throw config_error(flag, "bad fault '" + spec + "'", hint);
  Fault f;
  if (parts[0] == "slow") f.kind = Fault::Kind::slow;
  else if (parts[0] == "lossy") f.kind = Fault::Kind::lossy;
  else if (parts[0] == "hang") f.kind = Fault::Kind::hang;
  else if (parts[0] == "die") f.kind = Fault::Kind::die;
  else if (parts[0] == "freeze") f.kind = Fault::Kind::freeze;
  else throw config_error(flag, "unknown fault kind '" + parts[0] + "'", hint);
  f.rank = parse_int(parts[1], flag, 0);
  f.check = parts[2];
  if (f.check == "node" || std::find(kAllChecks.begin(), kAllChecks.end(), f.check) == kAllChecks.end())
    throw config_error(flag, "fault check '" + f.check + "' is not a fabric check", hint);
  if (f.kind == Fault::Kind::freeze && f.check != "mpi_p2p")
    throw config_error(flag, "a freeze fault strikes inside the blocking MPI latency batches: its CHECK must be mpi_p2p", hint);
  if (parts.size() == 4) {
    if (f.kind != Fault::Kind::slow) throw config_error(flag, "only a slow fault takes a FACTOR", hint);
    f.factor = parse_seconds(parts[3], flag);
    if (f.factor < 1) throw config_error(flag, "slow FACTOR must be >= 1", hint);
  }
  return f;
}

}  // namespace

std::string describe(const Fault& f) {
  const char* k = f.kind == Fault::Kind::slow ? "slow" : f.kind == Fault::Kind::lossy ? "lossy"
                  : f.kind == Fault::Kind::hang ? "hang" : f.kind == Fault::Kind::die ? "die" : "freeze";
  std::string s = std::string(k) + ":" + std::to_string(f.rank) + ":" + f.check;
  if (f.kind == Fault::Kind::slow) s += ":" + std::to_string(static_cast<int>(f.factor));
  return s;
}

Options parse_args(const std::vector<std::string>& args) {
  Options o;
  cli::Parser p("ib_healthcheck");
  p.flag("-p,--profile", 1, [&](const std::string& v) { o.profile = v; });
  p.flag("-c,--checks", 1, [&](const std::string& v) {
    o.checks = split(v, ',');
    for (const auto& c : o.checks)
      if (std::find(kAllChecks.begin(), kAllChecks.end(), c) == kAllChecks.end())
        throw config_error("--checks", "unknown check '" + c + "'",
                           "choose from node, mpi_p2p, ucx_p2p, allreduce, alltoall, nccl_allreduce, nccl_alltoall");
  });
  p.flag("--node-local", 0, [&](const std::string&) { o.node_local = true; });
  p.flag("--lat-size", 1, [&](const std::string& v) { o.lat_size = parse_size(v, "--lat-size"); });
  p.flag("-s,--bw-size", 1, [&](const std::string& v) { o.bw_size = parse_size(v, "--bw-size"); });
  p.flag("-b,--min-size", 1, [&](const std::string& v) { o.min_size = parse_size(v, "--min-size"); });
  p.flag("-e,--max-size", 1, [&](const std::string& v) { o.max_size = parse_size(v, "--max-size"); });
  p.flag("-t,--timeout", 1, [&](const std::string& v) { o.timeout_s = parse_seconds(v, "--timeout"); });
  p.flag("-r,--rounds", 1, [&](const std::string& v) { o.rounds = parse_int(v, "--rounds", 1); });
  p.flag("--lat-iters", 1, [&](const std::string& v) { o.lat_iters = parse_int(v, "--lat-iters", 1); });
  p.flag("--bw-iters", 1, [&](const std::string& v) { o.bw_iters = parse_int(v, "--bw-iters", 1); });
  p.flag("-w,--window", 1, [&](const std::string& v) { o.window = parse_int(v, "--window", 1); });
  p.flag("-n,--iters", 1, [&](const std::string& v) { o.coll_iters = parse_int(v, "--iters", 1); });
  p.flag("-j,--json", 1, [&](const std::string& v) { o.json_file = v; });
  p.flag("-x,--exclude-file", 1, [&](const std::string& v) { o.exclude_file = v; });
  p.flag("--drain", 0, [&](const std::string&) { o.drain = true; });
  p.flag("--drain-execute", 0, [&](const std::string&) { o.drain = o.drain_execute = true; });
  p.flag("-q,--quiet", 0, [&](const std::string&) { o.quiet = true; });
  p.flag("--emulate-nodes", 0, [&](const std::string&) { o.emulate_nodes = true; });
  p.flag("--inject-fault", 1, [&](const std::string& v) { o.faults.push_back(parse_fault(v)); });
  o.help = !p.parse(args);
  if (o.help) return o;
  if (!o.help && o.profile.empty())
    throw config_error("--profile", "no profile given", "pass --profile local or --profile FILE.json (see --help)");
  if (o.min_size && o.max_size && *o.min_size > *o.max_size)
    throw config_error("--min-size", "--min-size is larger than --max-size");
  if (o.lat_size && *o.lat_size == 0) throw config_error("--lat-size", "size must be at least 1 byte");
  if (o.bw_size && *o.bw_size == 0) throw config_error("--bw-size", "size must be at least 1 byte");
  if (o.min_size && *o.min_size < 8) throw config_error("--min-size", "collective sizes start at 8 bytes (2 floats)");
  return o;
}

std::string help_text() {
  return R"(ib_healthcheck — find the bad node or link of an allocation before a training run does.

Usage:
  srun --ntasks-per-node=1 ib_healthcheck --profile azure-ndv4 [options]   # the allocation
  ib_healthcheck --node-local --profile azure-ndv4                          # this node, no MPI
  mpirun -np 4 ib_healthcheck --profile local --emulate-nodes               # tests, one host

Runs node-local checks (CPU, memory, hugepages, InfiniBand/RoCE ports in /sys/class/infiniband and as
UCX sees them, GPUs, free disk), then fabric checks: point-to-point latency and uni-/bidirectional
bandwidth over MPI and over UCX (UCP) for pairings that give every node several partners, and MPI
all-reduce and all-to-all (algbw/busbw as nccl-tests defines them). One MPI rank per node.

Options:
  -p, --profile FILE|NAME   expected values and thresholds (inputs/healthcheck/NAME.json)   [required]
  -c, --checks LIST         comma list of node,mpi_p2p,ucx_p2p,allreduce,alltoall,
                            nccl_allreduce,nccl_alltoall (device buffers: CUDA builds;
                            in the default set when the profile expects GPUs)      [all]
      --node-local          node checks only, without MPI (fits Slurm's HealthCheckProgram)
      --lat-size SIZE       point-to-point latency message size                             [profile, 8]
  -s, --bw-size SIZE        point-to-point bandwidth message size                           [profile, 4M]
  -b, --min-size SIZE       smallest collective size (sizes double from here)               [profile, 8]
  -e, --max-size SIZE       largest collective size; thresholds apply at this size          [profile, 256M]
  -r, --rounds N            partners per node (round-robin pairings, at most nodes-1)       [profile, 5]
  -t, --timeout SECONDS     limit on every communication; a silent rank is named after it   [profile, 30]
      --lat-iters N         ping-pongs per pair                                             [1000]
      --bw-iters N          windows per direction and pair                                  [20]
  -w, --window N            messages in flight per bandwidth window                         [16]
  -n, --iters N             most iterations per collective size                             [20]
  -j, --json FILE           write the report as JSON too
  -x, --exclude-file FILE   write failed nodes, comma-separated, for sbatch --exclude
      --drain               print 'scontrol update NodeName=N State=DRAIN Reason="ib_healthcheck: ..."'
                            for each failed node (dry run)
      --drain-execute       run those scontrol commands
  -q, --quiet               no progress lines
  -h, --help                this text
      --version             version and git commit; @FILE stands for the flags written in FILE

Sizes take K, M, G suffixes (binary: 4M = 4194304). GB/s = 1e9 bytes/s.

Nodes are named by SLURMD_NODENAME when set, else the host name.

For tests only (never on a production allocation):
      --emulate-nodes       rank r is node "node<r>" (all ranks on one host)
      --inject-fault KIND:RANK:CHECK[:FACTOR]
                            slow  — that rank takes FACTOR (20) x as long for each operation
                            lossy — that rank corrupts the data it sends
                            hang  — that rank stops responding (sleeps) at the start of CHECK
                            die   — that rank exits at the start of CHECK (under srun the others name
                                    it; under mpirun the launcher ends the whole job: no report)
                            freeze — mpi_p2p only: that rank stops inside the timed (blocking)
                                    latency batches of its first pair, as a node dying there
                                    would; its partner's alarm ends the job naming it
                            CHECK: mpi_p2p, ucx_p2p, allreduce, alltoall, nccl_allreduce,
                                   nccl_alltoall

Exit codes:
  0  healthy: every check passed
  1  unhealthy: a node, link or collective failed, or a rank stopped responding (named in the report)
  2  could not run: usage, profile or setup error
)";
}

}  // namespace hpct::healthcheck
