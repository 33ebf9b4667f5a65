// nvme_bench's flags: the Options a run is given, parsed from fio-style flags (see kHelp).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hpct/io/aio_config.hpp"
#include "hpct/io/io_bench.hpp"

namespace nvme_bench {

using hpct::io::AioEngine;
using hpct::io::IoMode;

extern const char* kHelp;

struct Options {
  std::vector<std::string> paths;
  std::vector<IoMode> modes{IoMode::write, IoMode::read};
  uint64_t size = 1ull << 30;
  std::vector<size_t> block_sizes{1 << 20};
  std::vector<int> queue_depths{8};
  std::vector<int> threads{1};
  std::vector<AioEngine> engines{AioEngine::automatic};
  bool single_submit = false, overlap_events = true;
  double runtime = 0;
  int loops = 1;
  bool latency = false, sweep = false, tune = false, verify = false, keep = false, buffered = false, pin = false;
  bool fsync = true;
  std::string tune_output = "ds_aio_config.json";
  std::string json;
  uint64_t seed = 1;
  std::set<std::string> given;  // flags the user set (a sweep keeps those)
};

/// Parses the flags into o; returns false for --help. Throws hpct::Error naming the flag.
bool parse_args(const std::vector<std::string>& args, Options& o);

}  // namespace nvme_bench
