// Driver of ib_healthcheck (see healthcheck.hpp).
#include "healthcheck.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "checks.hpp"
#include "evaluate.hpp"
#include "fabric.hpp"
#include "hpct/comm/mpi.hpp"
#include "hpct/comm/gpu.hpp"
#include "hpct/comm/ucx.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/sysinfo.hpp"
#include "hpct/core/units.hpp"
#include "node_checks.hpp"

extern char** environ;

namespace hpct::healthcheck {

std::vector<std::string> selected_checks(const Options& o, const Profile& p) {
  std::vector<std::string> out;
  for (const auto& c : kAllChecks) {
    const bool wanted = o.checks.empty() ? (c.rfind("nccl_", 0) != 0 || p.gpu_count > 0)
                                         : std::find(o.checks.begin(), o.checks.end(), c) != o.checks.end();
    if (wanted) out.push_back(c);
  }
  return out;
}

namespace {

std::string mpi_thread_level() {
  int initialized = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized) return "none (node-local)";
  MPI_Query_thread(&level);
  return level == MPI_THREAD_SINGLE       ? "single"
         : level == MPI_THREAD_FUNNELED   ? "funneled"
         : level == MPI_THREAD_SERIALIZED ? "serialized"
                                          : "multiple";
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

Provenance provenance(const Options& o, const Profile& p, const std::vector<std::string>& nodes, const std::string& mode) {
  Provenance prov("ib_healthcheck");
  std::string nodelist = nodes.size() <= 16 ? join(nodes, ",") : join({nodes.begin(), nodes.begin() + 16}, ",") + ",...";
  prov.add("mode", mode)
      .add("profile", p.name + " (" + p.file + ")")
      .add("ranks", std::to_string(nodes.size()))
      .add("nodes", nodelist)
      .add("checks", join(selected_checks(o, p), ","))
      .add("sizes", "latency " + std::to_string(p.lat_size) + " B, bandwidth " + std::to_string(p.bw_size) +
                        " B, collectives " + std::to_string(p.coll_min) + ".." + std::to_string(p.coll_max) + " B")
      .add("timeout_s", format_seconds(p.timeout_s))
      .add("ucx", comm::ucx_available() ? comm::ucx_version() : "not built")
      .add("cuda_nccl", comm::gpu_support_built() ? "built" : "not built")
      .add("mpi_threads", mpi_thread_level());
  for (const auto& f : o.faults) prov.add("fault_injection", describe(f) + " (test only)");
  return prov;
}

// The outputs every mode shares: verdict, JSON, exclude file, drain commands. Returns the exit code.
int finish(const Options& o, const Evaluation& ev, const Provenance& prov, const std::string& mode) {
  int code = ev.healthy() ? kExitHealthy : kExitUnhealthy;
  std::fputs(ev.verdict_text().c_str(), stdout);
  auto bad = ev.unhealthy_nodes();
  if (!o.json_file.empty()) write_json_file(o.json_file, ev.json(prov.json(), mode, code));
  if (!o.exclude_file.empty()) {
    std::ofstream f(o.exclude_file);
    if (!f) throw file_error(o.exclude_file, "cannot write the exclude file");
    f << join(bad, ",") << "\n";
    std::printf("# exclude file %s: %s\n", o.exclude_file.c_str(), bad.empty() ? "(no nodes)" : join(bad, ",").c_str());
  }
  if (o.drain) {
    for (const auto& n : bad) {
      std::string reason = "ib_healthcheck: " + ev.drain_reason(n);
      std::string node_arg = "NodeName=" + n, reason_arg = "Reason=" + reason;
      std::printf("%sscontrol update NodeName=%s State=DRAIN Reason=\"%s\"\n", o.drain_execute ? "" : "# dry run: ",
                  n.c_str(), reason.c_str());
      if (o.drain_execute) {
        std::fflush(stdout);
        // No shell: the reason is passed as one argument, whatever it contains.
        const char* argv[] = {"scontrol", "update", node_arg.c_str(), "State=DRAIN", reason_arg.c_str(), nullptr};
        pid_t pid;
        int rc = posix_spawnp(&pid, "scontrol", nullptr, nullptr, const_cast<char**>(argv), environ);
        int status = 0;
        if (rc == 0) waitpid(pid, &status, 0);
        if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
          std::printf("# scontrol failed for %s (%s): the node is NOT drained\n", n.c_str(),
                      rc != 0 ? "scontrol not found" : "non-zero exit");
      }
    }
    if (bad.empty()) std::printf("# drain: no node to drain\n");
  }
  std::fflush(stdout);
  return code;
}

}  // namespace

void apply_overrides(const Options& o, Profile& p) {
  if (o.lat_size) p.lat_size = *o.lat_size;
  if (o.bw_size) p.bw_size = *o.bw_size;
  if (o.min_size) p.coll_min = *o.min_size;
  if (o.max_size) p.coll_max = *o.max_size;
  if (o.timeout_s) p.timeout_s = *o.timeout_s;
  if (o.rounds) p.rounds = *o.rounds;
  if (p.coll_max < p.coll_min) throw config_error("--max-size", "the largest collective size is below the smallest");
  if (p.bw_size >= (uint64_t(1) << 31) || p.lat_size >= (uint64_t(1) << 31))
    throw config_error("--bw-size", "point-to-point sizes must be below 2G (one MPI message)");
  if (p.coll_max > (uint64_t(1) << 33)) throw config_error("--max-size", "collective sizes must be at most 8G");
}

int run_node_local(const Options& o, const Profile& p) {
  std::string node = node_name();
  Provenance prov = provenance(o, p, {node}, "node-local");
  std::fputs(prov.text().c_str(), stdout);
  Evaluation ev(p, {node});
  std::printf("# check: node\n%s", ev.add_node_rows(run_node_checks(p, node)).c_str());
  return finish(o, ev, prov, "node-local");
}

int run_allocation(const Options& o, const Profile& p) {
  FabricContext ctx;
  ctx.world = MPI_COMM_WORLD;
  MPI_Comm_rank(ctx.world, &ctx.rank);
  MPI_Comm_size(ctx.world, &ctx.size);
  ctx.timeout_s = p.timeout_s;
  ctx.faults = o.faults;
  const bool root = ctx.rank == 0;

  // Who is who: node name and host name of every rank (a deadline-bounded gather).
  const size_t kName = 256;
  std::string me = o.emulate_nodes ? "node" + std::to_string(ctx.rank) : node_name();
  std::string mine = me + "\n" + host_name();
  mine.resize(kName - 1);
  std::vector<char> all(kName * static_cast<size_t>(ctx.size));
  MPI_Request req;
  HPCT_CHECK_MPI(MPI_Iallgather(mine.c_str(), static_cast<int>(kName), MPI_CHAR, all.data(), static_cast<int>(kName),
                                MPI_CHAR, ctx.world, &req));
  if (!comm::wait_all_until(&req, 1, ctx.deadline(), {true}))
    throw SilentPeer("not every rank joined within " + std::to_string(static_cast<int>(p.timeout_s)) + " s of the start");
  std::vector<std::string> hosts;
  for (int r = 0; r < ctx.size; ++r) {
    std::string s(all.data() + kName * static_cast<size_t>(r));
    auto nl = s.find('\n');
    ctx.nodes.push_back(s.substr(0, nl));
    hosts.push_back(s.substr(nl + 1));
  }
  for (const auto& f : o.faults)
    if (f.rank >= ctx.size)
      throw config_error("--inject-fault", "rank " + std::to_string(f.rank) + " does not exist in a job of " +
                                               std::to_string(ctx.size) + " ranks");
  {
    auto sorted = ctx.nodes;
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end())
      throw config_error("ranks", "two ranks run on node '" + *dup + "'; ib_healthcheck runs one rank per node",
                         "launch with srun --ntasks-per-node=1 (or mpirun --map-by ppr:1:node); "
                         "tests on one host use --emulate-nodes");
  }
  // More ranks than cores on this host (tests): give the core away while polling.
  long on_host = std::count(hosts.begin(), hosts.end(), hosts[static_cast<size_t>(ctx.rank)]);
  ctx.local_rank = static_cast<int>(std::count(hosts.begin(), hosts.begin() + ctx.rank, hosts[static_cast<size_t>(ctx.rank)]));
  ctx.poll.yield = on_host > sysconf(_SC_NPROCESSORS_ONLN);

  HPCT_CHECK_MPI(MPI_Comm_idup(ctx.world, &ctx.ctl, &req));
  if (!comm::wait_all_until(&req, 1, ctx.deadline(), ctx.poll)) throw SilentPeer("the control communicator timed out");
  MPI_Comm_set_errhandler(ctx.ctl, MPI_ERRORS_RETURN);

  const auto checks = selected_checks(o, p);
  const auto rounds = pairings(ctx.size, p.rounds);
  const auto sizes = size_sweep(p.coll_min, p.coll_max);
  P2pConfig p2p{p.lat_size, p.bw_size, o.lat_iters, o.bw_iters, o.window};

  Provenance prov = provenance(o, p, ctx.nodes, "allocation");
  std::unique_ptr<Evaluation> ev;
  std::unique_ptr<Progress> progress;
  if (root) {
    std::fputs(prov.text().c_str(), stdout);
    std::printf("# pairings: %zu rounds, each node meets %zu partners%s\n", rounds.size(), rounds.size(),
                ctx.size % 2 ? " (odd node count: one sits out per round)" : "");
    std::fflush(stdout);
    ev = std::make_unique<Evaluation>(p, ctx.nodes);
    // Progress: one case per p2p round and per collective size, weighted by bytes moved.
    int cases = 0;
    double weight = 0;
    for (const auto& c : checks) {
      if (c == "node") cases += 1, weight += 1e6;
      if (c == "mpi_p2p" || c == "ucx_p2p")
        cases += static_cast<int>(rounds.size()), weight += p2p_round_weight(p2p) * static_cast<double>(rounds.size());
      if (is_collective(c))
        for (uint64_t s : sizes) ++cases, weight += collective_weight(collective_bytes(c, s, ctx.size), o.coll_iters);
    }
    progress = std::make_unique<Progress>(cases, weight, o.quiet ? nullptr : stderr);
  }

  bool stopped = false, any_timeout = false, any_silent = false;
  std::string stop_reason;
  for (size_t ci = 0; ci < checks.size(); ++ci) {
    const std::string& check = checks[ci];
    if (stopped) {
      if (root) ev->add_not_run(check, "stopped after " + stop_reason, false);
      continue;
    }
    nlohmann::json report = {{"rows", nlohmann::json::array()}, {"timed_out", false}, {"error", ""}};
    bool timed_out = false;
    double t0 = comm::steady_seconds();
    if (check == "node") {
      report["rows"] = run_node_checks(p, ctx.nodes[static_cast<size_t>(ctx.rank)]);
      if (progress) progress->done("node checks", 1e6);
    } else if (!fresh_data_comm(ctx)) {
      timed_out = true;
      report["error"] = "a fresh communicator for " + check + " timed out";
    } else if (check == "mpi_p2p") {
      auto t = make_mpi_transport(ctx);
      report["rows"] = run_p2p(ctx, *t, check, p2p, rounds, progress.get(), timed_out);
    } else if (check == "ucx_p2p") {
      if (!comm::ucx_available()) {
        report["error"] = "built without UCX (install libucx-dev and reconfigure)";
      } else {
        std::string why;
        try {
          auto t = make_ucx_transport(ctx, why);
          if (t) report["rows"] = run_p2p(ctx, *t, check, p2p, rounds, progress.get(), timed_out);
          else report["error"] = why;
        } catch (const Error& e) {
          report["error"] = e.message();
        }
      }
    } else {
      report["rows"] = run_collective(ctx, check, sizes, o.coll_iters, progress.get(), timed_out);
    }
    report["timed_out"] = timed_out;
    // Rank 0's own part may have ended early or late; give the others a timeout beyond it.
    double wait_s = 2 * p.timeout_s + 5;
    PhaseSync sync = sync_phase(ctx, static_cast<int>(ci), report, wait_s);
    if (root) {
      nlohmann::json rows = nlohmann::json::array();
      std::string error;
      bool timed = false;
      for (size_t r = 0; r < sync.reports.size(); ++r) {
        if (!sync.reports[r]) continue;
        for (auto& x : (*sync.reports[r])["rows"]) rows.push_back(x);
        std::string e = (*sync.reports[r]).value("error", "");
        if (!e.empty() && error.empty()) error = ctx.nodes[r] + ": " + e;
        timed = timed || (*sync.reports[r]).value("timed_out", false);
      }
      if (!sync.silent.empty()) ev->add_silent(check, sync.silent, comm::steady_seconds() - t0);
      std::string table;
      if (check == "node") table = ev->add_node_rows(rows);
      else if (!error.empty() && rows.empty())
        ev->add_not_run(check, error, check != "ucx_p2p" || comm::ucx_available());
      else if (check == "mpi_p2p" || check == "ucx_p2p")
        table = ev->add_p2p(check, rows, expected_p2p_rows(rounds, ctx.nodes), sync.silent);
      else
        table = ev->add_collective(check, rows, sync.silent);
      std::printf("# check: %s\n%s", check.c_str(), table.empty() ? ("# not run: " + error + "\n").c_str() : table.c_str());
      std::fflush(stdout);
      any_timeout = any_timeout || timed;
      any_silent = any_silent || !sync.silent.empty();
    }
    if (!sync.go) {
      stopped = true;
      stop_reason = check + " (a rank timed out or stopped responding)";
    }
  }

  if (!stopped) {
    // Everyone is alive and nothing is pending: agree on the exit code and finalize normally.
    int code = 0;
    if (root) code = finish(o, *ev, prov, "allocation");
    HPCT_CHECK_MPI(MPI_Ibcast(&code, 1, MPI_INT, 0, ctx.ctl, &req));
    if (!comm::wait_all_until(&req, 1, comm::steady_seconds() + 3 * p.timeout_s + 10, ctx.poll))
      throw SilentPeer("rank 0 (" + ctx.nodes[0] + ") did not send the verdict");
    return code;
  }
  // Something is hung or pending: report, then end the job (MPI_Finalize would wait forever).
  if (root) {
    int code = finish(o, *ev, prov, "allocation");
    std::fprintf(stderr, "ib_healthcheck: %s; ending the job with MPI_Abort(%d) because MPI cannot finalize beside "
                 "a hung rank or pending operations\n", any_silent ? "a rank stopped responding" : "an operation timed out", code);
    std::fflush(stderr);
    comm::Environment::abort(code);
  }
  // Other ranks wait for rank 0's MPI_Abort; if it never comes, rank 0 itself is gone.
  std::string s;
  comm::recv_string_until(s, 0, 999, ctx.ctl, comm::steady_seconds() + 3 * p.timeout_s + 30, ctx.poll);
  throw SilentPeer("rank 0 (" + ctx.nodes[0] + ") did not end the job after a failed check");
}

}  // namespace hpct::healthcheck
