// Checks before a run allocates or trains (see preflight.hpp).
#include "hpct/engine/config/preflight.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "hpct/core/error.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/parallel/memory_estimate.hpp"

#include <algorithm>
#include <fstream>

namespace hpct::engine {

namespace {

std::string real(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

std::string parent_of(const std::string& file) {
  auto slash = file.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : file.substr(0, slash);
}

}  // namespace

void check_file_output(const std::string& file, const char* flag) {
  if (file.empty()) return;
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw config_error(flag, std::string(flag) + " " + file + " is a directory", "name a file");
  const std::string dir = parent_of(file);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw config_error(flag, std::string(flag) + " " + file + ": the directory " + dir + " does not exist",
                       "create it first, or name a file in an existing directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw config_error(flag, std::string(flag) + " " + file + ": the directory " + dir + " cannot be written: " + std::strerror(errno));
}

void check_run_outputs(const TrainConfig& cfg, const std::string& loaded) {
  check_file_output(cfg.json_summary, "--json");
  check_file_output(cfg.metrics_file, "--metrics-file");
  if (cfg.save_dir.empty()) return;
  const std::string& d = cfg.save_dir;
  struct stat st {};
  if (::stat(d.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    throw config_error("--save", "--save " + d + " is not a directory", "name a directory (checkpoints are iter_NNNNNNN.h5 files in it)");
  try {
    Checkpointer::make_directory(d);
  } catch (const Error& e) {
    throw config_error("--save", "--save " + d + ": " + e.message(), "choose a directory you can write");
  }
  if (::access(d.c_str(), W_OK | X_OK) != 0)
    throw config_error("--save", "--save " + d + " cannot be written: " + std::strerror(errno), "choose a directory you can write");
  const std::string newest = checkpoints_in(d);
  if (newest.empty()) return;
  const bool resumes_here = !loaded.empty() && real(parent_of(loaded)) == real(d);
  if (!resumes_here)
    throw config_error("--save", "--save " + d + " already holds checkpoints (" + newest + ") that this run" +
                                     (loaded.empty() ? " does not load" : " does not resume from (it loads " + loaded + ")") +
                                     ": its saves would overwrite them",
                       "add --load " + d + " to continue that run, or save to another directory");
}

std::string checkpoints_in(const std::string& dir) {
  std::string newest = Checkpointer::newest_checkpoint_in(dir);
  struct stat st {};
  if (newest.empty() && ::lstat((dir + "/latest").c_str(), &st) == 0) newest = "latest";
  return newest;
}

void require_no_checkpoints(const std::string& dir, const std::string& what) {
  const std::string newest = checkpoints_in(dir);
  if (!newest.empty())
    throw config_error(what, what + ": " + dir + " already holds checkpoints (" + newest +
                                 "): a new iteration-0 checkpoint there would replace `latest`, and a run resuming "
                                 "from that directory would restart at iteration 0",
                       "give a new or empty directory");
}

void check_host_memory(const TrainConfig& cfg, int ranks_on_node, int world_size) {
  if (cfg.device != "cpu") return;  // ZeRO-Offload: the device holds the model; host states are reported at start
  uint64_t avail = 0;
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    while (f >> key >> kb) {
      if (key == "MemAvailable:") avail = kb * 1024;
      f.ignore(1 << 20, '\n');
    }
  }
  if (avail == 0) return;  // no figure to check against
  const auto& z = cfg.zero;
  const bool opt_off = z.offload_optimizer.device != "none", par_off = z.offload_param.device != "none";
  const bool nvme = z.offload_optimizer.nvme() || z.offload_param.nvme();
  using parallel::Offload;
  const Offload o = !opt_off ? Offload::none
                    : par_off ? (nvme ? Offload::optimizer_param_nvme : Offload::optimizer_param_cpu)
                              : (nvme ? Offload::optimizer_nvme : Offload::optimizer_cpu);
  // Every rank as a one-device "node", so that the partitions are over the world exactly (nodes may
  // hold different rank counts); this node's need is its ranks times one rank's.
  parallel::ClusterShape c;
  c.devices_per_node = 1;
  c.nodes = std::max(1, world_size);
  c.device_bytes = 0;  // the CPU backend: ranks are host processes
  c.host_bytes = avail;
  c.nvme_bytes = UINT64_MAX / 4;  // NVMe space is checked where the swap files are made
  const auto prec = cfg.precision == PrecisionMode::fp32 ? parallel::StatePrecision::fp32 : parallel::StatePrecision::mixed;
  const parallel::MemoryPlan p = parallel::plan_memory(parallel::gpt_size(cfg.model, cfg.moe_ep), prec, z.stage, o, c);
  const uint64_t per_rank = p.device_total() + p.host_states_per_rank + p.host_buffers_per_rank;
  const uint64_t need = per_rank * (uint64_t)std::max(1, ranks_on_node);
  if (need <= avail) return;
  throw config_error("--num-layers/--hidden-size", "the model states of this run need " + format_bytes(double(need)) +
                         " of host memory on this node (" + format_bytes(double(per_rank)) + " per rank x " +
                         std::to_string(ranks_on_node) + " ranks; ZeRO stage " + std::to_string(z.stage) + ", " +
                         parallel::offload_name(o) + ", device states " + p.formula + "), the node has " +
                         format_bytes(double(avail)) + " available",
                     "a smaller model (--num-layers, --hidden-size, --seq-length, vocabulary), more ranks on more nodes with "
                     "a higher --zero-stage, or offload to NVMe (see pretrain_gpt --estimate-memory)");
}

void check_device_memory(const TrainConfig& cfg, int world_size, const DeviceNeed& need) {
  const auto& z = cfg.zero;
  uint64_t states = need.offload_states;
  std::string what = "ZeRO-Offload's 16-bit parameters and gradient sum";
  if (cfg.states_on_device()) {
    parallel::ClusterShape c;  // every rank its own device: the partitions are over the world
    c.devices_per_node = 1;
    c.nodes = std::max(1, world_size);
    c.device_bytes = need.free;
    c.host_bytes = c.nvme_bytes = UINT64_MAX / 4;
    const auto prec = cfg.precision == PrecisionMode::fp32 ? parallel::StatePrecision::fp32 : parallel::StatePrecision::mixed;
    const parallel::MemoryPlan p =
        parallel::plan_memory(parallel::gpt_size(cfg.model, cfg.moe_ep), prec, z.stage, parallel::Offload::none, c);
    states = p.device_states;
    what = "the GPU-resident ZeRO stage " + std::to_string(z.stage) + " states, " + p.formula;
  } else if (z.stage == 3) {
    what = "ZeRO-Offload's block in use at stage 3";
  } else if (cfg.precision == PrecisionMode::fp32) {
    what = "ZeRO-Offload's fp32 parameters and gradient sum";
  }
  const uint64_t want = states + need.activations;
  if (want <= need.free) return;
  const std::string fix =
      cfg.states_on_device()
          ? "ZeRO-Offload (zero_optimization.offload_optimizer.device cpu), a higher --zero-stage over more GPUs, or a "
            "smaller --micro-batch-size / --recompute-activations for the activations"
          : "a smaller --micro-batch-size or --seq-length, --recompute-activations, or ZeRO stage 3 "
            "(zero_optimization.stage 3 keeps only the blocks in use on the GPU)";
  throw config_error("--micro-batch-size/zero_optimization",
                     "this run needs at least " + format_bytes(double(want)) + " of GPU memory on " + need.device + " (" +
                         what + ": " + format_bytes(double(states)) + "; the activations of one micro-batch of " +
                         std::to_string(cfg.micro_batch) + " x " + std::to_string(cfg.model.max_seq_length) + ": " +
                         format_bytes(double(need.activations)) + "), and it has " + format_bytes(double(need.free)) +
                         " free of " + format_bytes(double(need.total)),
                     fix);
}

}  // namespace hpct::engine

