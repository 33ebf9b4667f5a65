// A health-check profile: what one cluster type's nodes should have and how fast its fabric should
// be (inputs/healthcheck/*.json, one per cluster type). Expected values are absolute; fabric
// thresholds are absolute, relative to the allocation's median, or both (both must hold).
// Loading validates every key strictly and throws one line naming the file and the key.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace hpct::healthcheck {

/// A limit on one fabric figure. For "higher is better" figures (bandwidth) a value passes when
/// value >= min and value >= min_fraction_of_median * median; for latency when value <= max and
/// value <= max_factor_of_median * median. Relative limits need a median of at least three values
/// to mean anything (with two nodes there is one pair: it is its own median).
struct Threshold {
  bool higher_is_better = true;
  std::optional<double> absolute;  // "min" (bandwidth) or "max" (latency)
  std::optional<double> relative;  // "min_fraction_of_median" in (0, 1] or "max_factor_of_median" >= 1
  bool passes(double value, double median) const;
  /// ">= 12.00 (0.5 x median 24.00)" — the limit that applies, written out.
  std::string describe(double median) const;
  bool empty() const { return !absolute && !relative; }
};

struct Profile {
  std::string file, name, description;
  // node-local expectations
  long long cpu_min_cores = 1;
  std::string cpu_model_regex;  // empty: any model
  uint64_t memory_min_bytes = 0;
  long long hugepages_min = 0;  // HugePages_Total
  long long ib_ports = 0;       // exactly this many ports must be present and in ib_state
  double ib_min_rate_gbps = 0;
  std::string ib_state = "ACTIVE";
  std::string ib_link_layer;    // "InfiniBand" or "Ethernet" (RoCE); empty: either
  long long gpu_count = 0;      // exactly; read from /proc/driver/nvidia/gpus without CUDA
  uint64_t gpu_min_memory = 0;  // per GPU; needs a CUDA build
  std::string disk_path = "/tmp";
  uint64_t disk_min_free = 0;
  // fabric thresholds
  Threshold p2p_latency_us{false, {}, {}};
  Threshold p2p_bw_GBps, p2p_bibw_GBps, allreduce_busbw_GBps, alltoall_busbw_GBps;
  Threshold nccl_allreduce_busbw_GBps, nccl_alltoall_busbw_GBps;  // device buffers, one GPU per node
  // sweep and limits
  uint64_t lat_size = 8, bw_size = 4u << 20, coll_min = 8, coll_max = 256u << 20;
  int rounds = 5;
  double timeout_s = 30;
};

/// Loads and validates a profile. `name_or_file` is a path, or a bare name resolved in
/// $HPCT_SOURCE_DIR/inputs/healthcheck/ and then in the source tree this binary was built from.
Profile load_profile(const std::string& name_or_file);

}  // namespace hpct::healthcheck
