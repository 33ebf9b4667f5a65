// hpct/parallel/memory_estimate.hpp — the memory planner behind `pretrain_gpt --estimate-memory`:
// for a GPT shape and a cluster shape, the bytes each ZeRO stage and offload choice needs per
// device, per host (node) and per NVMe (node), and whether that fits.
//
// It is arithmetic only: no allocation, no MPI, no model built. Ψ is counted the way model::Gpt lays
// out its parameters (a test holds the two equal), and the per-parameter bytes follow the ZeRO paper
// (arXiv 1910.02054): mixed precision keeps 2 + 2 + K bytes (16-bit params and grads, K = 12 for the
// fp32 master, m and v); fp32 training keeps 4 + 4 + 8. The engine (zero.hpp) stores the same.
// Not counted: activations (they depend on the micro-batch and recomputation), the communication
// library's own buffers and allocator fragmentation. The working buffers that ZeRO itself needs
// (a gradient bucket, gathered layers, swap buffers) are counted and stated apart from the states.
// Trade-off: one simple, stated model per stage that a user can check by hand, rather than a
// replica of one engine's allocator; docs/zero.md writes every formula down.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/core/report.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::parallel {

/// Parameter counts of our GPT (model/gpt.hpp: tied output head, learned positions, biases, two
/// LayerNorms per layer and a final one), computed from the shape alone.
/// With tensor parallelism (cfg.tensor_parallel = T) every count is one tensor-parallel rank's:
/// 1/T of the split matrices (and the vocabulary's rows) plus the replicas whole.
/// MoE (cfg.moe, expert_parallel = EP): every expert-parallel rank holds E/EP of each MoE layer's
/// experts (1/T of each with expert tensor parallelism); their states are ZeRO-sharded over the
/// expert-data-parallel ranks, devices / (T x EP), the dense ones over devices / T.
struct GptSize {
  int tensor_parallel = 1;     // T: the planner's ZeRO group is devices / T ranks
  int expert_parallel = 1;     // EP: expert states are sharded over devices / (T x EP) ranks
  uint64_t params = 0;         // Ψ = dense + experts: equals the numel of the blocks a rank holds
  uint64_t dense = 0;          // everything but the experts (this tensor-parallel rank's parts)
  uint64_t experts = 0;        // this rank's experts, every MoE layer
  uint64_t embedding = 0;      // block 0: word (Vp, C) + position (T, C) embeddings
  uint64_t layer = 0;          // one dense transformer block: 12 C^2 + 13 C
  uint64_t moe_layer = 0;      // an MoE layer's block without its experts (attention, norms, router, residual MLP)
  uint64_t expert = 0;         // one expert's block: 8 C^2 + 5 C (its part with expert tensor parallelism)
  int moe_layers = 0;
  uint64_t final_norm = 0;     // 2 C (C with RMSNorm)
  uint64_t output_layer = 0;   // the untied LM head (Vp/T, C), a block of its own; 0 when tied
  uint64_t largest_block = 0;  // ZeRO-3's gather unit: the largest block
  std::string largest_block_name;
  uint64_t largest_dense_block = 0;  // the largest block but the experts (MoE: each group's engine has its own buffers)
  uint64_t whole_model = 0;    // every parameter, every expert, tensor-parallel parts whole
  // LoRA (cfg.lora): Ψ, dense and the largest block count what trains (the adapters and any modules
  // to save), which ZeRO shards as usual; the frozen base is apart, held whole by every rank in the
  // working precision (parallel::GroupedStore's frozen group), with no gradient or optimizer state.
  uint64_t frozen = 0;          // the frozen base's parameters (0 without LoRA)
  uint64_t frozen_working = 0;  // of those, the most widened to fp32 at once in 16-bit runs: the
                                // embedding (read from the input to the head) + one layer, or
                                // at the end an untied head if that is larger
};
/// Validates cfg (config_error naming the flag) and counts; expert_parallel must divide every MoE
/// layer's experts (config_error naming --moe-expert-parallel-size).
GptSize gpt_size(const model::GptConfig& cfg, int expert_parallel = 1);

enum class StatePrecision { mixed, fp32 };

/// Bytes per parameter of each model state.
struct StateBytes {
  uint64_t param;      // working copy read by forward/backward: 2 (mixed) or 4 (fp32)
  uint64_t grad;       // gradient in the working precision: 2 or 4
  uint64_t optimizer;  // K: fp32 master + m + v = 12 (mixed); m + v = 8 (fp32: the params are the master)
};
StateBytes state_bytes(StatePrecision p);
const char* precision_name(StatePrecision p);

/// Where the optimizer states (and, for stage 3, the parameters) live besides the device.
enum class Offload { none, optimizer_cpu, optimizer_nvme, optimizer_param_cpu, optimizer_param_nvme };
const char* offload_name(Offload o);  // "none", "optimizer:cpu", ..., "optimizer+param:nvme"
/// As DeepSpeed: optimizer offload to CPU for stages 1-3, to NVMe and parameter offload for stage 3.
bool offload_allowed(int stage, Offload o);

/// What the job runs on. A "device" is one data-parallel rank: a GPU, or on the CPU backend a host
/// process (then device_bytes = 0 and its memory counts against the host's).
struct ClusterShape {
  int nodes = 1;
  int devices_per_node = 1;
  uint64_t device_bytes = 0;  // memory of one device; 0 = devices are host processes
  uint64_t host_bytes = 0;    // CPU memory per node
  uint64_t nvme_bytes = 0;    // NVMe space per node (0 = none)
  int devices() const { return nodes * devices_per_node; }
  bool devices_in_host_memory() const { return device_bytes == 0; }
  /// Throws config_error naming the --estimate-* flag.
  void validate() const;
};

/// This machine: 1 node, `ranks` host processes, MemTotal from /proc/meminfo, free space of
/// nvme_path (statvfs). Throws file_error if /proc/meminfo cannot be read.
ClusterShape local_cluster_shape(int ranks, const std::string& nvme_path);

/// The working buffers the planner assumes (DeepSpeed's knob names and source defaults where one
/// exists). Stated in the report and the JSON.
struct BufferModel {
  uint64_t reduce_bucket_elems = 500000000;  // reduce_bucket_size: stage-2 gradient bucket (at least one block)
  uint64_t allgather_bucket_elems = 500000000;  // allgather_bucket_size: GPU-resident stages 1-2, parameters being all-gathered after a step
  uint64_t prefetch_elems = 50000000;        // stage3_prefetch_bucket_size: gathered ahead of use
  int live_blocks = 2;                       // stage 3: gathered blocks live besides the prefetch (in use + releasing)
  uint64_t optimizer_tile_elems = 1 << 20;  // NVMe optimizer: sweep tile (io::SwapStoreConfig::chunk_elems)
  int optimizer_swap_buffers = 4;            // offload_optimizer.buffer_count: slots of one tile of each array
  int param_swap_buffers = 5;                // offload_param.buffer_count: NVMe param staging slices per rank
};

/// One (stage, offload) row. Per-rank figures are exact integers: a partition is ceil(Ψ/N)
/// elements (the engine pads Ψ to a multiple of N); with experts ceil(dense/N) + ceil(experts/(N/EP)).
/// A LoRA model's frozen base (F parameters) adds param-bytes x F to every rank's states (to the
/// host's with parameter offload) and, in 16-bit runs, 4 x frozen_working to its buffers.
struct MemoryPlan {
  int stage = 0;
  Offload offload = Offload::none;
  std::string formula;             // device model states, ASCII: "2P + (2+12)P/N" (P = Ψ)
  uint64_t device_states = 0;      // per device: params, grads, optimizer states held there
  uint64_t device_buffers = 0;     // per device: bucket / gathered blocks
  uint64_t host_states_per_rank = 0;
  uint64_t host_buffers_per_rank = 0;
  uint64_t nvme_per_rank = 0;
  uint64_t host_per_node = 0;      // devices_per_node x host per rank (+ device totals when devices are host processes)
  uint64_t nvme_per_node = 0;
  bool fits_device = true, fits_host = true, fits_nvme = true;
  // DeepSpeed's estimator for the same choice where it has one (mixed precision), -1 where not.
  double ds_device = -1, ds_host_per_node = -1;

  uint64_t device_total() const { return device_states + device_buffers; }
  bool fits() const { return fits_device && fits_host && fits_nvme; }
  /// "yes", or "no (device, host)" naming what overflows.
  std::string fit_text() const;
};

/// One plan. Throws config_error for a stage outside 0..3 or an offload the stage does not allow.
MemoryPlan plan_memory(const GptSize& size, StatePrecision p, int stage, Offload o, const ClusterShape& c,
                       const BufferModel& b = {});

struct MemoryEstimate {
  model::GptConfig model;
  GptSize size;
  StatePrecision precision = StatePrecision::mixed;
  ClusterShape cluster;
  BufferModel buffers;
  std::vector<MemoryPlan> plans;  // every allowed (stage, offload), stage-major

  /// Aligned table (GB = 1e9 bytes), one row per plan.
  ReportTable table() const;
  /// "#"-prefixed lines: model, Ψ, largest block, precision, cluster, buffer assumptions.
  std::string header_text() const;
  /// Machine-readable twin: model, precision, cluster, buffers, plans with exact bytes.
  nlohmann::json json() const;
};

/// Plans every allowed (stage, offload) for the model on the cluster. Validates both.
MemoryEstimate estimate_memory(const model::GptConfig& cfg, StatePrecision p, const ClusterShape& c,
                               const BufferModel& b = {}, int expert_parallel = 1);

}  // namespace hpct::parallel
