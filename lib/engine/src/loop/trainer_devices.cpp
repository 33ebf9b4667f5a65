// Where a Trainer computes besides the model's backend: the host AdamW's threads, and the
// tensor-parallel collectives of a --device cuda run. Split from trainer.cpp (the training loop).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "hpct/comm/gpu.hpp"
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

// Tensor parallelism on GPUs: NCCL on the device buffers when every rank of the job has a GPU of
// its own (NCCL refuses two ranks of one communicator on one GPU), as Megatron runs; otherwise, or
// when NCCL cannot start, through host buffers (tensor_parallel.hpp). The ranks of a tensor-parallel
// group agree before any uses NCCL, so no group is half on NCCL and half on MPI.
void Trainer::setup_tp_collectives() {
  const auto& world = comm::Communicator::world();
  const auto& tp = grid_.tp();
  std::string why;
  const int gpus = comm::gpu_count(&why);
  const bool own = gpus >= world.node_local_size();
  if (world.allreduce_min(own ? 1.0 : 0.0) > 0) {
    const double window = 120;  // NCCL's start: the unique id's broadcast and the rings' set-up
    tp_nccl_ = comm::NcclComm::create(tp.raw(), world.node_local_rank(), comm::steady_seconds() + window, {}, &why);
    if (tp.allreduce_min(tp_nccl_ ? 1.0 : 0.0) == 0) {
      if (tp_nccl_) why = "NCCL did not start on another rank of the tensor-parallel group";
      tp_nccl_.reset();
    }
  } else {
    why = own ? "ranks on another node share its GPUs"
              : std::to_string(world.node_local_size()) + " ranks share " + std::to_string(gpus) + " GPU(s) on this node";
  }
  model_->set_tensor_parallel_device_comm(tp_nccl_.get(), 600);
  tp_collectives_ = tp_nccl_ ? "NCCL on device buffers" : "host buffers through MPI (" + why + ")";
}

}  // namespace hpct::engine
