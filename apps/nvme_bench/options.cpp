// nvme_bench's flags (see options.hpp).
#include "options.hpp"

#include <map>
#include <sstream>

#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"

using namespace hpct;

namespace nvme_bench {

const char* kHelp = R"(usage: nvme_bench --path DIR[,DIR...] [options]

Measures sequential write/read bandwidth (and, on request, random-read IOPS and latency
percentiles) of a storage path through hpctrain's async IO engine (io_uring, libaio or psync),
with O_DIRECT. Under MPI every rank works on its own file, DIR/nvme_bench.<node>.<rank>.dat,
and rank 0 reports each rank and the aggregate (total bytes / slowest rank's time).
Flags taking a LIST accept comma-separated values and run every combination.

  -p, --path DIR[,DIR...]     directories to test; rank r uses the (local rank mod n)-th (required)
  -m, --mode LIST             write, read, randread                      (default: write,read)
  -s, --size SIZE             bytes per rank's file, K/M/G/T suffixes (binary)    (default: 1G)
  -b, --block-size LIST       bytes per IO request                       (default: 1M)
  -q, --queue-depth LIST      requests in flight per thread              (default: 8)
  -t, --threads LIST          threads splitting each request (ds: intra_op_parallelism) (default: 1)
  -e, --engine LIST           auto, io_uring, libaio, psync; auto = the first of the others
                              this kernel runs, as the offload engine picks (default: auto)
      --single-submit         one submit call per request (ds: single_submit)
      --no-overlap-events     submit a batch, wait for all of it, repeat (ds: overlap_events false)
  -r, --runtime S             stop issuing IO in a case after S seconds  (default: no limit)
      --loops N               run the whole grid N times over and report each case's
                              median run                  (default: 1; 3 with --tune)
      --latency               per-request latency percentiles for sequential modes too
      --sweep                 sweep a grid: block 128K,1M,8M x depth 1,8,32 x threads 1,2 x
                              the engines this machine runs x write,read (lists given override)
      --tune                  run the sweep and write the best case (largest read + write GB/s
                              of the medians, as ds_nvme_tune picks) as a ds_config "aio" block
      --tune-output FILE      where --tune writes it                      (default: ds_aio_config.json)
      --verify                read each written file back and compare with what was written
                              (with --loops, the last loop's write)
      --keep                  keep the files (default: delete them at the end)
      --buffered              go through the page cache instead of O_DIRECT (only when asked;
                              reads drop the file's cached pages first)
      --pin                   mlock the IO buffers (DeepSpeed's locked tensors)
      --no-fsync              do not fdatasync before a write case's clock stops
      --seed N                data pattern and random-offset seed       (default: 1)
      --json FILE             machine-readable results (same fields as the table)
  -h, --help                  this text
      --version               version and git commit; @FILE stands for the flags written in FILE

Units: MB/s = 1e6 bytes/s, GB/s = 1e9 bytes/s; latency from submission to completion, in us.
Exit status: 0 all cases ran (and verified), 1 bad input or an IO error (the message names the
rank, file, offset and length).
)";

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

long long parse_int(const std::string& v, const std::string& flag, long long lo, long long hi) {
  return cli::to_int(flag, v, lo, hi);
}

}  // namespace

bool parse_args(const std::vector<std::string>& args, Options& o) {
  cli::Parser p("nvme_bench");
  auto list = [](const std::string& v, auto&& each) {
    for (auto& x : split_list(v)) each(x);
  };
  p.flag("-p,--path", 1, [&](const std::string& v) { o.paths = split_list(v); });
  p.flag("-m,--mode", 1, [&](const std::string& v) {
    o.modes.clear();
    list(v, [&](const std::string& m) { o.modes.push_back(io::parse_mode(m, "--mode")); });
  });
  p.flag("-s,--size", 1, [&](const std::string& v) { o.size = parse_size(v, "--size"); });
  p.flag("-b,--block-size", 1, [&](const std::string& v) {
    o.block_sizes.clear();
    list(v, [&](const std::string& b) { o.block_sizes.push_back(parse_size(b, "--block-size")); });
  });
  p.flag("-q,--queue-depth", 1, [&](const std::string& v) {
    o.queue_depths.clear();
    list(v, [&](const std::string& q) { o.queue_depths.push_back(static_cast<int>(parse_int(q, "--queue-depth", 1, 4096))); });
  });
  p.flag("-t,--threads", 1, [&](const std::string& v) {
    o.threads.clear();
    list(v, [&](const std::string& t) { o.threads.push_back(static_cast<int>(parse_int(t, "--threads", 1, 256))); });
  });
  p.flag("-e,--engine", 1, [&](const std::string& v) {
    o.engines.clear();
    list(v, [&](const std::string& e) { o.engines.push_back(io::parse_engine(e, "--engine")); });
  });
  p.flag("-r,--runtime", 1, [&](const std::string& v) {
    char* end = nullptr;
    o.runtime = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end || !(o.runtime >= 0))
      throw config_error("--runtime", "'" + v + "' is not a number of seconds >= 0");
  });
  p.flag("--loops", 1, [&](const std::string& v) { o.loops = static_cast<int>(parse_int(v, "--loops", 1, 1000)); });
  p.flag("--seed", 1, [&](const std::string& v) { o.seed = static_cast<uint64_t>(parse_int(v, "--seed", 0, (1LL << 62))); });
  p.flag("--tune-output", 1, [&](const std::string& v) { o.tune_output = v; });
  p.flag("--json", 1, [&](const std::string& v) { o.json = v; });
  p.flag("--single-submit", 0, [&](const std::string&) { o.single_submit = true; });
  p.flag("--no-overlap-events,--sequential-requests", 0, [&](const std::string&) { o.overlap_events = false; });
  p.flag("--latency", 0, [&](const std::string&) { o.latency = true; });
  p.flag("--sweep", 0, [&](const std::string&) { o.sweep = true; });
  p.flag("--tune", 0, [&](const std::string&) { o.tune = o.sweep = true; });
  p.flag("--verify", 0, [&](const std::string&) { o.verify = true; });
  p.flag("--keep", 0, [&](const std::string&) { o.keep = true; });
  p.flag("--buffered", 0, [&](const std::string&) { o.buffered = true; });
  p.flag("--pin", 0, [&](const std::string&) { o.pin = true; });
  p.flag("--no-fsync", 0, [&](const std::string&) { o.fsync = false; });
  if (!p.parse(args)) return false;
  o.given.insert(p.given().begin(), p.given().end());
  if (o.paths.empty()) throw config_error("--path", "is required: the directory (or directories) to test", "see --help");
  if (o.modes.empty()) throw config_error("--mode", "lists no mode");
  if (o.block_sizes.empty() || o.queue_depths.empty() || o.threads.empty() || o.engines.empty())
    throw config_error("--block-size/--queue-depth/--threads/--engine", "an empty list");
  if (o.sweep) {
    if (!o.given.count("--block-size")) o.block_sizes = {128 << 10, 1 << 20, 8 << 20};
    if (!o.given.count("--queue-depth")) o.queue_depths = {1, 8, 32};
    if (!o.given.count("--threads")) o.threads = {1, 2};
    if (!o.given.count("--engine")) {
      o.engines.clear();
      for (AioEngine e : {AioEngine::io_uring, AioEngine::libaio})
        if (io::engine_available(e)) o.engines.push_back(e);
      if (o.engines.empty()) o.engines.push_back(AioEngine::psync);  // the last fallback, as `auto`
    }
  }
  if (o.tune) {
    // One run per case lets a disk's swing pick the winner (on the development VM fio's own reads of
    // one configuration land near the disk's rate or at twice it, from the host's cache; see
    // docs/benchmarks/checkpoints-io.md); the median of three passes damps that.
    if (!o.given.count("--loops")) o.loops = 3;
    bool r = false, w = false;
    for (auto m : o.modes) r |= m == IoMode::read, w |= m == IoMode::write;
    if (!(r && w)) throw config_error("--mode", "--tune compares read + write bandwidth and needs both modes");
  }
  for (size_t bs : o.block_sizes) {
    if (bs < 4096 || bs % 4096 != 0 || bs > (size_t{1} << 30))
      throw config_error("--block-size", std::to_string(bs) + " bytes is not a multiple of 4096 in 4K..1G",
                         "O_DIRECT needs requests aligned to the device's logical block size, e.g. 128K, 1M, 8M");
  }
  return true;
}

}  // namespace nvme_bench
