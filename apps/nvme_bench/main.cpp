// nvme_bench — storage bandwidth, IOPS and latency through hpctrain's async IO engine, per MPI rank
// and aggregated: the figure ZeRO-Infinity offload and checkpointing will see on N nodes.
// Thin: parse flags, validate the paths on every rank, run the grid of cases (lib/io/io_bench),
// gather and report. fio-style flags; `--tune` writes the best case as a ds_config `aio` block.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/sysinfo.hpp"
#include "hpct/core/units.hpp"
#include "hpct/io/aio_config.hpp"
#include "hpct/io/async_io.hpp"
#include "hpct/io/io_bench.hpp"
#include "options.hpp"

using namespace hpct;
using hpct::io::AioConfig;
using hpct::io::AioEngine;
using hpct::io::IoMode;
using nvme_bench::Options;

namespace {


struct CaseSpec {
  IoMode mode;
  AioConfig aio;
};

struct RankFigures {
  std::string node, path;
  io::IoResult r;
};

struct CaseOutcome {
  CaseSpec spec;
  std::vector<RankFigures> ranks;
  double agg_mb_per_s = 0, agg_iops = 0, seconds = 0, cpu_seconds = 0, bytes = 0;
  double p50 = -1, p99 = -1, p999 = -1;  // worst rank's
  std::string verified = "-";
  std::vector<double> loops_mb_per_s;  // every loop's aggregate, in the order run
};

std::string case_label(const CaseSpec& c) {
  std::string s = std::string(io::mode_name(c.mode)) + " " + c.aio.describe();
  return s;
}

// What the ranks sharing a directory will write there: `writers` of them write a --size file (a
// write case, or a read with no full kept file to read), and the files those writers already have
// hold `reclaimable` bytes that the rewrite frees first (it truncates them).
struct SpaceNeed {
  int writers = 0;
  double reclaimable = 0;
};

// Everything about the target that can be checked before any IO: exists, is a writable directory,
// has room for every rank's file on it, takes O_DIRECT, and the block sizes fit its alignment.
std::string check_target(const Options& o, const std::string& dir, const SpaceNeed& space) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return "--path " + dir + ": does not exist (" + std::strerror(errno) + "); create it or choose another directory";
  if (!S_ISDIR(st.st_mode)) return "--path " + dir + ": is not a directory";
  if (::access(dir.c_str(), W_OK) != 0) return "--path " + dir + ": is not writable by this user";
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return "--path " + dir + ": statvfs failed: " + std::strerror(errno);
  double avail = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  double need = static_cast<double>(o.size) * space.writers;
  if (need > avail + space.reclaimable)
    return "--path " + dir + ": --size " + format_bytes(static_cast<double>(o.size)) + " x " + std::to_string(space.writers) +
           " rank(s) writing on it needs " + format_bytes(need) + ", only " + format_bytes(avail) + " free" +
           (space.reclaimable > 0 ? " (+ " + format_bytes(space.reclaimable) + " in its kept files, rewritten)" : "") +
           "; lower --size";
  if (!o.buffered) {
    std::string probe = dir + "/.nvme_bench_probe." + std::to_string(::getpid());
    std::string err = comm::error_text_of([&] {
      io::IoFile f = io::IoFile::open(probe, io::IoFile::Mode::write, true, true);
      for (size_t bs : o.block_sizes)
        if (bs % f.alignment() != 0)
          throw config_error("--block-size", format_bytes(static_cast<double>(bs)) + " is not a multiple of the direct-IO alignment " +
                                                 std::to_string(f.alignment()) + " of " + dir);
    });
    ::unlink(probe.c_str());
    if (!err.empty()) {
      if (err.find("does not support O_DIRECT") != std::string::npos)
        return "--path " + dir + ": the filesystem does not support O_DIRECT; rerun with --buffered to measure through the page cache";
      return err;
    }
  }
  for (AioEngine e : o.engines) {
    std::string why;
    if (!io::engine_available(e, &why)) return std::string("--engine ") + io::engine_name(e) + ": not available here: " + why;
  }
  return "";
}

std::vector<CaseSpec> build_grid(const Options& o) {
  std::vector<CaseSpec> out;
  for (AioEngine e : o.engines)
    for (size_t bs : o.block_sizes)
      for (size_t qi = 0; qi < o.queue_depths.size(); ++qi)
        for (int t : o.threads) {
          int qd = o.queue_depths[qi];
          if (e == AioEngine::psync) {  // one request at a time per thread: depth means nothing
            if (qi > 0) continue;
            qd = 1;
          }
          for (IoMode m : o.modes) {
            CaseSpec c{m, AioConfig{}};
            c.aio.engine = e;
            c.aio.block_size = bs;
            c.aio.queue_depth = qd;
            c.aio.thread_count = t;
            c.aio.single_submit = o.single_submit;
            c.aio.overlap_events = o.overlap_events;
            c.aio.direct = !o.buffered;
            c.aio.pin_buffers = o.pin;
            out.push_back(c);
          }
        }
  return out;
}

// Every loop's aggregate MB/s, in the order run ("812/790/845"), for the table's last column.
std::string loops_text(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : "/") + std::to_string(static_cast<long long>(std::llround(x)));
  return s;
}

// Ctrl-C or scancel (SIGINT, SIGTERM, SIGHUP) in the middle of a case would leave this rank's
// file, up to --size bytes, on a node-local disk the next job needs. The handler removes it (unless
// --keep) and then dies of the signal as it would have. Only async-signal-safe calls.
char g_scratch_file[4096];  // empty: nothing to remove

extern "C" void remove_scratch_and_die(int sig) {
  if (g_scratch_file[0]) ::unlink(g_scratch_file);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Only the main thread takes these signals: main() blocks them before MPI starts its threads and
// unblocks them on its own thread after, and the IO engine's threads start with them blocked. So
// the handler never runs while this thread is creating the file again. A signal ignored at start
// (nohup's SIGHUP, SIGINT in a background job) stays ignored.
void remove_file_on_signals(const std::string& path) {
  if (path.size() >= sizeof g_scratch_file) return;  // cannot hold the name: the file stays
  std::memcpy(g_scratch_file, path.c_str(), path.size() + 1);
  struct sigaction sa {};
  sa.sa_handler = remove_scratch_and_die;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, sig);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

// The termination signals, blocked in every thread MPI starts (see remove_file_on_signals).
sigset_t termination_signals() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&s, sig);
  return s;
}

nlohmann::json num_or_null(double v) { return v < 0 || !std::isfinite(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }

int run(int argc, char** argv) {
  comm::Communicator world = comm::Communicator::world();
  const bool root = world.rank() == 0;
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!nvme_bench::parse_args(args, o)) {
    if (root) std::cout << nvme_bench::kHelp;
    return 0;
  }
  ::signal(SIGXFSZ, SIG_IGN);  // a file-size limit becomes an EFBIG error with the file named

  const int lrank = world.node_local_rank();
  const std::string node = node_name();
  const std::string dir = o.paths[static_cast<size_t>(lrank) % o.paths.size()];
  const std::string file = dir + "/nvme_bench." + node + "." + std::to_string(world.rank()) + ".dat";
  auto keys = world.allgather_string(node + "\n" + std::filesystem::weakly_canonical(dir).string());
  // `auto` becomes the engine it stands for, so the cases and the --tune block name a real one.
  std::vector<AioEngine> named;
  for (AioEngine e : o.engines) {
    std::string skipped;
    AioEngine r = io::resolve_engine(e, &skipped);
    if (root && !skipped.empty()) std::fprintf(stderr, "nvme_bench: --engine auto: using %s (%s)\n", io::engine_name(r), skipped.c_str());
    if (std::find(named.begin(), named.end(), r) == named.end()) named.push_back(r);
  }
  o.engines = named;
  // Every rank must run the same grid: `auto` standing for different engines on different nodes
  // (one refuses io_uring) would pair unlike cases in the aggregate and the collectives.
  {
    std::string mine;
    for (AioEngine e : o.engines) mine += std::string(mine.empty() ? "" : ",") + io::engine_name(e);
    std::vector<std::string> all = world.allgather_string(mine);
    for (int q = 1; q < world.size(); ++q)
      if (all[q] != all[0])
        throw config_error("--engine", "auto means " + all[0] + " on rank 0 but " + all[q] + " on rank " + std::to_string(q) +
                                           " (a node refuses an engine)", "name one engine that every node runs, e.g. --engine libaio");
  }
  std::vector<CaseSpec> grid = build_grid(o);
  // A file kept by an earlier run (--keep) with at least --size bytes is read as it is, so a read
  // can run in its own process after a write, as fio's do (its pattern is that run's: --verify
  // checks only what this run writes). Such a read-only run needs no free space.
  struct stat kept {};
  const bool have_file = ::stat(file.c_str(), &kept) == 0;
  bool file_full = have_file && static_cast<uint64_t>(kept.st_size) >= o.size;
  const bool writes = !file_full || std::any_of(grid.begin(), grid.end(), [](const CaseSpec& c) { return c.mode == IoMode::write; });
  std::vector<double> writer = world.allgather(writes ? 1.0 : 0.0);
  std::vector<double> held = world.allgather(writes && have_file ? static_cast<double>(kept.st_blocks) * 512.0 : 0.0);
  SpaceNeed space;
  for (int q = 0; q < world.size(); ++q)
    if (keys[q] == keys[world.rank()]) {  // ranks of this node that share this directory share its free space
      space.writers += writer[q] > 0 ? 1 : 0;
      space.reclaimable += held[q];
    }
  comm::throw_if_any(world, check_target(o, dir, space));

  Progress progress(static_cast<int>(grid.size()) * o.loops, 0, root ? stderr : nullptr);
  if (root) {
    std::fprintf(stderr, "nvme_bench: %zu case(s) x %d loop(s), %s per rank, %d rank(s), %s\n", grid.size(), o.loops,
                 format_bytes(static_cast<double>(o.size)).c_str(), world.size(), o.buffered ? "buffered" : "O_DIRECT");
  }

  std::vector<CaseOutcome> outcomes;
  std::vector<std::string> failures;
  auto cleanup = [&] {
    if (!o.keep) ::unlink(file.c_str());
    g_scratch_file[0] = 0;  // a later signal must not remove a newer file of that name
  };
  if (!o.keep) remove_file_on_signals(file);
  // One run's aggregate over all ranks (collective): total bytes and requests / the slowest rank's seconds.
  struct Rate {
    double bytes_per_s = 0, requests_per_s = 0;
  };
  auto aggregate = [&](const io::IoResult& r) {
    std::vector<double> b = world.allgather(static_cast<double>(r.bytes));
    std::vector<double> q = world.allgather(static_cast<double>(r.requests));
    std::vector<double> s = world.allgather(r.seconds);
    double tot = 0, reqs = 0, mx = 0;
    for (int k = 0; k < world.size(); ++k) tot += b[k], reqs += q[k], mx = std::max(mx, s[k]);
    return mx > 0 ? Rate{tot / mx, reqs / mx} : Rate{};
  };
  try {
    // --loops N runs the whole grid N times over (pass by pass), not each case N times in a row: a
    // disk whose speed drifts over minutes then spreads its drift over every case, so the medians
    // of two configurations (the tuner's comparison) are taken over the same stretch of time.
    std::vector<std::vector<io::IoResult>> runs(grid.size());
    std::vector<std::vector<double>> agg(grid.size());
    std::vector<std::vector<double>> bad_at(grid.size());  // --verify: each rank's first bad offset, or -1
    for (int pass = 0; pass < o.loops; ++pass) {
      for (size_t ci = 0; ci < grid.size(); ++ci) {
        const CaseSpec& spec = grid[ci];
        // A read needs a whole file. Whether this rank's is whole is its own (a --runtime write may
        // stop early on one rank and not on another), but the error exchange is on every rank.
        if (spec.mode != IoMode::write) {
          comm::throw_if_any(world, comm::error_text_of([&] {
            if (!file_full) io::prepare_file(file, o.size, spec.aio, o.seed + world.rank());
          }));
          file_full = true;
        }
        io::IoCase c;
        c.mode = spec.mode;
        c.aio = spec.aio;
        c.size = o.size;
        c.runtime = o.runtime;
        c.record_latency = o.latency || spec.mode == IoMode::randread;
        c.fsync = o.fsync;
        c.seed = o.seed + world.rank();
        io::IoResult r;
        world.barrier();
        std::string err = comm::error_text_of([&] { r = io::run_io_case(file, c); });
        comm::throw_if_any(world, err);
        runs[ci].push_back(r);
        const Rate rate = aggregate(r);
        agg[ci].push_back(rate.bytes_per_s);
        if (spec.mode == IoMode::write) file_full = r.bytes == o.size;
        // The last pass's write is what the file holds now: it is the one read back.
        if (o.verify && spec.mode == IoMode::write && pass + 1 == o.loops) {
          int64_t bad = -1;
          comm::throw_if_any(world, comm::error_text_of([&] { bad = io::verify_file(file, r.bytes, spec.aio, o.seed + world.rank()); }));
          bad_at[ci] = world.allgather(static_cast<double>(bad));
        }
        const std::string iops =
            spec.mode == IoMode::randread ? ", " + std::to_string(static_cast<long long>(rate.requests_per_s)) + " IOPS" : "";
        char line[240];
        std::snprintf(line, sizeof line, "%s: %.1f MB/s%s%s", case_label(spec).c_str(), agg[ci].back() / 1e6, iops.c_str(),
                      o.loops > 1 ? (" (loop " + std::to_string(pass + 1) + "/" + std::to_string(o.loops) + ")").c_str() : "");
        progress.done(line, 1.0);
      }
    }
    for (size_t ci = 0; ci < grid.size(); ++ci) {
      const CaseSpec& spec = grid[ci];
      // The loop with the median aggregate bandwidth represents the case (the upper one of two).
      std::vector<size_t> idx(runs[ci].size());
      for (size_t l = 0; l < idx.size(); ++l) idx[l] = l;
      std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return agg[ci][a] < agg[ci][b]; });
      const io::IoResult& mine = runs[ci][idx[idx.size() / 2]];
      CaseOutcome out;
      out.spec = spec;
      for (double a : agg[ci]) out.loops_mb_per_s.push_back(a / 1e6);
      std::vector<double> bytes = world.allgather(static_cast<double>(mine.bytes));
      std::vector<double> secs = world.allgather(mine.seconds);
      std::vector<double> cpu = world.allgather(mine.cpu_seconds);
      std::vector<double> reqs = world.allgather(static_cast<double>(mine.requests));
      std::vector<double> p50 = world.allgather(mine.lat_p50_us);
      std::vector<double> p99 = world.allgather(mine.lat_p99_us);
      std::vector<double> p999 = world.allgather(mine.lat_p999_us);
      std::vector<std::string> nodes = world.allgather_string(node);
      std::vector<std::string> files = world.allgather_string(file);
      double tot_bytes = 0, tot_reqs = 0, max_s = 0, tot_cpu = 0;
      for (int k = 0; k < world.size(); ++k) {
        RankFigures f;
        f.node = nodes[k];
        f.path = files[k];
        f.r.bytes = static_cast<uint64_t>(bytes[k]);
        f.r.seconds = secs[k];
        f.r.cpu_seconds = cpu[k];
        f.r.requests = static_cast<uint64_t>(reqs[k]);
        f.r.lat_p50_us = p50[k];
        f.r.lat_p99_us = p99[k];
        f.r.lat_p999_us = p999[k];
        out.ranks.push_back(f);
        tot_bytes += bytes[k];
        tot_reqs += reqs[k];
        tot_cpu += cpu[k];
        max_s = std::max(max_s, secs[k]);
        out.p50 = std::max(out.p50, p50[k]);
        out.p99 = std::max(out.p99, p99[k]);
        out.p999 = std::max(out.p999, p999[k]);
      }
      out.seconds = max_s;
      out.bytes = tot_bytes;
      out.cpu_seconds = tot_cpu;
      out.agg_mb_per_s = max_s > 0 ? tot_bytes / max_s / 1e6 : 0;
      out.agg_iops = max_s > 0 ? tot_reqs / max_s : 0;
      if (!bad_at[ci].empty()) {
        out.verified = "yes";
        for (int k = 0; k < world.size(); ++k)
          if (bad_at[ci][k] >= 0) {
            out.verified = "NO";
            failures.push_back(case_label(spec) + ": rank " + std::to_string(k) + " read back different data at offset " +
                               std::to_string(static_cast<int64_t>(bad_at[ci][k])) + " of " + files[k]);
          }
      }
      outcomes.push_back(std::move(out));
    }
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();

  // Tune: the configuration with the largest read + write aggregate bandwidth (ds_nvme_tune's rule).
  nlohmann::json best_json;
  if (o.tune) {
    std::map<std::string, std::pair<const CaseOutcome*, const CaseOutcome*>> by_cfg;  // write, read
    for (const auto& c : outcomes) {
      AioConfig k = c.spec.aio;
      std::string key = k.describe();
      if (c.spec.mode == IoMode::write) by_cfg[key].first = &c;
      if (c.spec.mode == IoMode::read) by_cfg[key].second = &c;
    }
    const CaseOutcome *bw = nullptr, *br = nullptr;
    for (const auto& [k, wr] : by_cfg) {
      if (!wr.first || !wr.second) continue;
      if (!bw || wr.first->agg_mb_per_s + wr.second->agg_mb_per_s > bw->agg_mb_per_s + br->agg_mb_per_s) {
        bw = wr.first;
        br = wr.second;
      }
    }
    if (bw && root) {
      nlohmann::json block = {{"aio", bw->spec.aio.to_ds_json()}};
      write_json_file(o.tune_output, block);
      std::printf("Best performance (GB/sec): read = %.2f, write = %.2f  [%s]\n", br->agg_mb_per_s / 1e3, bw->agg_mb_per_s / 1e3,
                  bw->spec.aio.describe().c_str());
      std::printf("ds_config aio block written to %s:\n%s\n", o.tune_output.c_str(), block.dump(2).c_str());
      best_json = {{"config", bw->spec.aio.to_ds_json()},
                   {"read_MBps", br->agg_mb_per_s},
                   {"write_MBps", bw->agg_mb_per_s},
                   {"file", o.tune_output}};
    }
  }

  if (!root) return failures.empty() ? 0 : 1;

  Provenance prov("nvme_bench");
  prov.add("ranks", std::to_string(world.size()))
      .add("paths", [&] {
        std::string s;
        for (auto& p : o.paths) s += (s.empty() ? "" : ",") + p;
        return s;
      }())
      .add("size_per_rank", format_bytes(static_cast<double>(o.size)))
      .add("io", o.buffered ? "buffered" : "O_DIRECT")
      .add("loops", std::to_string(o.loops))
      .add("fsync_in_write_time", o.fsync ? "yes" : "no");
  ReportTable table({{"mode", ""},
                     {"engine", ""},
                     {"block", "bytes"},
                     {"qd", ""},
                     {"threads", ""},
                     {"submit", ""},
                     {"ranks", ""},
                     {"bandwidth", "MB/s", 1},
                     {"iops", "1/s", 0},
                     {"lat_p50", "us", 1},
                     {"lat_p99", "us", 1},
                     {"lat_p99_9", "us", 1},
                     {"cpu", "s", 2},
                     {"verified", ""},
                     {"loops", "MB/s"}});
  ReportTable per_rank({{"case", ""}, {"rank", ""}, {"node", ""}, {"bandwidth", "MB/s", 1}, {"seconds", "s", 3}, {"cpu", "s", 2}, {"file", ""}});
  nlohmann::json cases = nlohmann::json::array();
  auto opt = [](double v) -> ReportTable::Cell { return v < 0 ? ReportTable::Cell{} : ReportTable::Cell{v}; };
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const auto& c = outcomes[i];
    const AioConfig& a = c.spec.aio;
    std::string submit = std::string(a.single_submit ? "single" : "batch") + (a.overlap_events ? "+overlap" : "+drain");
    table.add_row({std::string(io::mode_name(c.spec.mode)), std::string(io::engine_name(a.engine)),
                   static_cast<int64_t>(a.block_size), static_cast<int64_t>(a.queue_depth), static_cast<int64_t>(a.thread_count),
                   submit, static_cast<int64_t>(world.size()), c.agg_mb_per_s, c.agg_iops, opt(c.p50), opt(c.p99), opt(c.p999),
                   c.cpu_seconds, c.verified, loops_text(c.loops_mb_per_s)});
    nlohmann::json ranks = nlohmann::json::array();
    for (size_t k = 0; k < c.ranks.size(); ++k) {
      const auto& f = c.ranks[k];
      per_rank.add_row({static_cast<int64_t>(i), static_cast<int64_t>(k), f.node, f.r.mb_per_s(), f.r.seconds, f.r.cpu_seconds, f.path});
      ranks.push_back({{"rank", k},
                       {"node", f.node},
                       {"file", f.path},
                       {"bytes", f.r.bytes},
                       {"seconds", f.r.seconds},
                       {"bandwidth_MBps", f.r.mb_per_s()},
                       {"iops", f.r.iops()},
                       {"cpu_seconds", f.r.cpu_seconds},
                       {"lat_p50_us", num_or_null(f.r.lat_p50_us)},
                       {"lat_p99_us", num_or_null(f.r.lat_p99_us)},
                       {"lat_p99_9_us", num_or_null(f.r.lat_p999_us)}});
    }
    nlohmann::json cj = {{"mode", io::mode_name(c.spec.mode)},
                         {"aio", a.to_ds_json()},
                         {"ranks", world.size()},
                         {"bytes", static_cast<uint64_t>(c.bytes)},
                         {"seconds", c.seconds},
                         {"bandwidth_MBps", c.agg_mb_per_s},
                         {"bandwidth_GBps", c.agg_mb_per_s / 1e3},
                         {"loops_MBps", c.loops_mb_per_s},
                         {"iops", c.agg_iops},
                         {"lat_p50_us", num_or_null(c.p50)},
                         {"lat_p99_us", num_or_null(c.p99)},
                         {"lat_p99_9_us", num_or_null(c.p999)},
                         {"cpu_seconds", c.cpu_seconds},
                         {"verified", c.verified == "-" ? nlohmann::json(nullptr) : nlohmann::json(c.verified == "yes")},
                         {"per_rank", ranks}};
    cases.push_back(cj);
  }
  std::cout << prov.text() << table.text();
  if (world.size() > 1) std::cout << "#\n# per rank (case = row number above, from 0)\n" << per_rank.text();
  std::cout << summary_footer(outcomes.size(), failures) << std::flush;
  if (!o.json.empty()) {
    nlohmann::json doc = {{"provenance", prov.json()},
                          {"units", {{"bandwidth", "MB/s = 1e6 bytes/s, aggregate = total bytes / slowest rank's seconds"},
                                     {"latency", "microseconds, submission to completion, worst rank's percentile"}}},
                          {"cases", cases},
                          {"result", failures.empty() ? "OK" : "FAILED"},
                          {"failures", failures}};
    if (!best_json.is_null()) doc["tune"] = best_json;
    write_json_file(o.json, doc);
  }
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (hpct::print_version_if_asked("nvme_bench", argc, argv)) return 0;
  const sigset_t term = termination_signals();
  pthread_sigmask(SIG_BLOCK, &term, nullptr);
  comm::Environment env(&argc, &argv);
  pthread_sigmask(SIG_UNBLOCK, &term, nullptr);
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    // Flag errors (every rank parses the same flags) and errors shared by comm::throw_if_any: every rank
    // has it, so all exit together and rank 0 says it once.
    if (comm::Communicator::world().rank() == 0) std::fprintf(stderr, "nvme_bench: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_bench: error: [rank %d] %s\n", comm::Communicator::world().rank(), e.what());
    comm::Environment::abort(1);
  }
}
