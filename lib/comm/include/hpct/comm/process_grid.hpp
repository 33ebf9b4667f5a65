// hpct/comm/process_grid.hpp — the named process grid: tensor (tp), expert (ep), data (dp) axes.
//
// Ranks are laid out with tp fastest, then ep, then dp (tp groups are neighbours, so they land on
// one node first). Worked example, world = 8, tp = 2, ep = 2, dp = 2:
//   rank  = dp_index * (ep*tp) + ep_index * tp + tp_index
//   tp groups: {0,1} {2,3} {4,5} {6,7}
//   ep groups: {0,2} {1,3} {4,6} {5,7}             all-to-all of MoE tokens
//   expert-dp groups: {0,4} {1,5} {2,6} {3,7}      ranks holding the same experts: expert gradients
//   dp groups (dense): {0,2,4,6} {1,3,5,7}         same tp index: dense gradients, data sharding
// The dense data-parallel group spans ep x dp ranks (DeepSpeed's data_parallel_group: every rank
// of it reads different samples); the expert-data-parallel group is its ep-strided subset. With
// ep = 1 the two are the same ranks. The grid is passed explicitly so that the model and ZeRO code
// never reach for a global communicator.
#pragma once
#include "hpct/comm/mpi.hpp"

namespace hpct::comm {

struct GridShape {
  int tp = 1;
  int ep = 1;
  int dp = 1;  // the expert-data-parallel size; the dense data-parallel size is ep * dp
};

class ProcessGrid {
 public:
  /// Collective over world. Throws (on every rank alike) when world.size() is not tp*ep*dp.
  ProcessGrid(const Communicator& world, int tp, int ep);

  const GridShape& shape() const { return shape_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  const Communicator& world() const { return world_; }
  const Communicator& tp() const { return tp_; }
  const Communicator& ep() const { return ep_; }
  /// The dense data-parallel group (ep x dp ranks with this rank's tp index): samples, dense gradients.
  const Communicator& dp() const { return dp_; }
  /// The expert-data-parallel group (dp ranks with this rank's tp and ep index): expert gradients.
  const Communicator& expert_dp() const { return edp_; }
  /// A one-line description, e.g. "world 8 = tp 2 x ep 2 x dp 2".
  std::string describe() const;

 private:
  GridShape shape_;
  int world_rank_ = 0;
  int world_size_ = 1;
  Communicator world_, tp_, ep_, dp_, edp_;
};

}  // namespace hpct::comm
