// Where a Trainer computes besides the model's backend: the host AdamW's threads, and the
// tensor-parallel collectives of a --device cuda run. Split from trainer.cpp (the training loop).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "hpct/comm/gpu.hpp"
#include "hpct/engine/config/preflight.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "hpct/kernels/optim.hpp"

namespace hpct::engine {

// Host AdamW threads (CPU training, ZeRO-Offload). Without a count given, a rank that is not pinned
// sees the whole node: it takes its share of the node's CPUs instead of running its AdamW on all of
// them. The node's rank count is collective over the trainer's ranks: every rank asks for it,
// whatever it then decides.
void Trainer::setup_host_threads() {
  const int local_ranks = grid_.world().node_local_size();
  if (cfg_.optimizer_threads > 0) {
    kernels::set_optimizer_threads(cfg_.optimizer_threads);
  } else if (!std::getenv("OMP_NUM_THREADS") && !std::getenv("SLURM_CPUS_PER_TASK")) {
    const int cpus = kernels::optimizer_threads(), hw = static_cast<int>(std::thread::hardware_concurrency());
    if (hw > 0 && cpus >= hw && local_ranks > 1) kernels::set_optimizer_threads(std::max(1, hw / local_ranks));
  }
}

// The model's attention kernel at its micro-batch (decided there by the backend, said on the start
// line). A run that asked for the fused kernel (--attention-kernel fused, Megatron's
// --use-flash-attn) on the GPU stops where it cannot serve, rather than running slower unasked.
void Trainer::choose_attention_kernel() {
  const kernels::AttentionKernel k = model_->attention_kernel(cfg_.micro_batch, cfg_.model.max_seq_length);
  attention_kernel_ = k.what;
  if (cfg_.attention_kernel == "fused" && ops_ && !ops_->host_memory() && !k.fused)
    throw config_error(cfg_.attention_kernel_flag.substr(0, cfg_.attention_kernel_flag.find(' ')),
                       "the fused attention kernel (" + cfg_.attention_kernel_flag + ") cannot serve this run: " + k.what,
                       "use --attention-kernel auto (the materialised kernel where the fused one cannot serve)");
}

// Tensor parallelism on GPUs: NCCL on the device buffers when every rank of the job has a GPU of
// its own (NCCL refuses two ranks of one communicator on one GPU), as Megatron runs; otherwise, or
// when NCCL cannot start, through host buffers (tensor_parallel.hpp). The ranks of a tensor-parallel
// group agree before any uses NCCL, so no group is half on NCCL and half on MPI.
namespace {
constexpr double kNcclStartSeconds = 120;  // NCCL's start: the unique id's broadcast and the rings' set-up

// Collective over group: NCCL over its ranks, or nullptr (and why) when it did not start on all.
std::unique_ptr<comm::NcclComm> open_nccl(const comm::Communicator& group, const char* name, std::string* why) {
  auto nccl = comm::NcclComm::create(group.raw(), comm::Communicator::world().node_local_rank(),
                                     comm::steady_seconds() + kNcclStartSeconds, {}, why);
  if (group.allreduce_min(nccl ? 1.0 : 0.0) == 0) {
    if (nccl) *why = std::string("NCCL did not start on another rank of the ") + name + " group";
    nccl.reset();
  }
  return nccl;
}
}  // namespace

// Before the engines allocate: can this rank's GPU hold the states and one micro-batch's
// activations? A refusal on one rank (GPUs differ, or hold other jobs' memory) is every rank's.
void Trainer::check_device_fits() {
  comm::throw_if_any(grid_.world(), comm::error_text_of([&] {
    DeviceNeed need;
    size_t free_b = 0, total_b = 0;
    if (!ops_ || !ops_->device_memory(&free_b, &total_b)) return;
    need.device = ops_->name();
    need.free = free_b, need.total = total_b;
    // What the workspace still has to take: a run with a curriculum or random-LTD reserved it already
    // (the free memory no longer counts it).
    const size_t want = model_->workspace_bytes(cfg_.micro_batch, cfg_.model.max_seq_length);
    const size_t held = model_->activation_bytes() - ops_->scratch_bytes();
    need.activations = want > held ? want - held : 0;
    if (!cfg_.states_on_device())
      need.offload_states = parallel::DeviceStore::device_bytes_needed(
          model_->layout(), cfg_.zero.stage <= 2,
          cfg_.precision == PrecisionMode::fp32 ? kernels::Precision::fp32 : compute_precision(), model_->held_blocks());
    check_device_memory(cfg_, grid_.world().size(), need);
  }));
}

bool Trainer::own_gpus(std::string* why) const {
  const auto& world = comm::Communicator::world();
  const int gpus = cfg_.device == "cuda" ? comm::gpu_count(why) : 0;
  const bool own = gpus >= world.node_local_size();
  if (world.allreduce_min(own ? 1.0 : 0.0) > 0) return true;
  if (cfg_.device != "cuda") *why = "not a --device cuda run";
  else if (own) *why = "ranks on another node share its GPUs";
  else *why = std::to_string(world.node_local_size()) + " ranks share " + std::to_string(gpus) + " GPU(s) on this node";
  return false;
}

void Trainer::setup_tp_collectives() {
  std::string why;
  if (own_gpus(&why)) tp_nccl_ = open_nccl(grid_.tp(), "tensor-parallel", &why);
  model_->set_tensor_parallel_device_comm(tp_nccl_.get(), 600);
  tp_collectives_ = tp_nccl_ ? "NCCL on device buffers" : "host buffers through MPI (" + why + ")";
}

// The start line's account of the GPU-resident engine's data-parallel collectives.
std::string Trainer::describe_dp_collectives(const comm::DeviceCollectives& dc) const {
  if (!dc.queues()) return "device buffers, each collective waited for";
  const auto& z = cfg_.zero;
  return std::string("NCCL on device buffers, on their own stream: ") +
         (z.overlap_comm ? "the gradient reductions beside the backward (overlap_comm, reduce_bucket_size)"
                         : "each gradient reduction finished before the backward goes on (overlap_comm false)") +
         ", the parameter all-gathers beside the next forward (allgather_bucket_size" +
         (z.stage == 3 ? "; stage 3 prefetching within stage3_prefetch_bucket_size)" : ")");
}

// The GPU-resident engine's data-parallel gradients and parameters: NCCL on device buffers where
// every rank has a GPU of its own (DeepSpeed's layout), as tensor parallelism decides; a group of
// one rank needs none. A test's transport stands in for NCCL when the Trainer was given one.
comm::DeviceCollectives* Trainer::open_dp_collectives(const comm::Communicator& group, bool own, std::string* why) {
  if (group.size() == 1) return nullptr;
  std::unique_ptr<comm::DeviceCollectives> dc;
  if (dp_factory_) dc = dp_factory_(group);
  else if (own) dc = open_nccl(group, "data-parallel", why);
  if (!dc) return nullptr;
  dp_dc_.push_back(std::move(dc));
  return dp_dc_.back().get();
}

}  // namespace hpct::engine
