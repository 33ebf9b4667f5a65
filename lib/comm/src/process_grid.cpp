#include "hpct/comm/process_grid.hpp"

namespace hpct::comm {

ProcessGrid::ProcessGrid(const Communicator& world, int tp, int ep) {
  world_rank_ = world.rank();
  world_size_ = world.size();
  if (tp < 1 || ep < 1 || world_size_ % (tp * ep) != 0)
    throw config_error(tp == 1 ? "--moe-expert-parallel-size" : "--tensor-model-parallel-size/--moe-expert-parallel-size",
                       "world size " + std::to_string(world_size_) + " is not divisible by tp*ep = " +
                           std::to_string(tp) + "*" + std::to_string(ep),
                       "launch a multiple of tp*ep ranks");
  shape_ = GridShape{tp, ep, world_size_ / (tp * ep)};
  int tp_idx = world_rank_ % tp;
  int ep_idx = (world_rank_ / tp) % ep;
  int dp_idx = world_rank_ / (tp * ep);
  world_ = world.split(0, world_rank_);
  tp_ = world.split(dp_idx * ep + ep_idx, tp_idx);
  ep_ = world.split(dp_idx * tp + tp_idx, ep_idx);
  edp_ = world.split(ep_idx * tp + tp_idx, dp_idx);
  dp_ = world.split(tp_idx, dp_idx * ep + ep_idx);
}

std::string ProcessGrid::describe() const {
  return "world " + std::to_string(world_size_) + " = tp " + std::to_string(shape_.tp) + " x ep " +
         std::to_string(shape_.ep) + " x dp " + std::to_string(shape_.dp);
}

}  // namespace hpct::comm
