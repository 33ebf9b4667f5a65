// hpct/parallel/grouped_store.hpp — one ZeRO engine per reducing group behind one ParamStore.
//
// A model's blocks are reduced over different groups: dense blocks over the dense data-parallel
// group, expert blocks (MoE) only over the expert-data-parallel group, the ranks that hold the
// same experts (Megatron's DDP keeps expert parameters in separate buffers for the same reason).
// GroupedStore takes the model's whole layout (every tensor, every expert: the checkpoint schema)
// and the blocks this rank holds, builds one engine per group on `schema.subset(held blocks of
// the group)` (a ShardedOptimizer: ZeroEngine in host memory unless the caller's factory makes
// another, such as the device-resident DeviceEngine), and routes the model's block ids to the engine that owns them. Checkpoint pieces
// come back in the schema's flat indices, so a checkpoint does not depend on which rank held what.
// With one group (a dense model) it is one ZeroEngine over the whole layout, exactly as before.
// A frozen group (LoRA's base weights: blocks that do not train) has no engine: FrozenBlocks
// (frozen_blocks.hpp) holds them whole on every rank, where the engines' states live, with no
// gradient (grads() is nullptr), no optimizer state and no checkpoint pieces.
// Tensor parallelism: the schema is this rank's (its tensors' parts, ParamLayout's Partition);
// the engines never see the difference, and the norms sum over `tp` with replicas counted once.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/param_layout.hpp"
#include "hpct/model/param_store.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/parallel/frozen_blocks.hpp"
#include "hpct/parallel/sharded_optimizer.hpp"
#include "hpct/parallel/zero.hpp"

namespace hpct::parallel {

struct StoreGroup {
  ReduceGroup group = ReduceGroup::dense;
  std::vector<int> blocks;                  // schema block ids this rank holds, in schema order
  const comm::Communicator* comm = nullptr; // the group's data-parallel communicator
  std::string swap_tag;                     // "" = the engine's default
  bool frozen = false;                      // the blocks do not train (comm unused)
};

/// Makes the engine of one group over its layout (which outlives the engine). Collective over
/// the group's communicator.
using EngineFactory = std::function<std::unique_ptr<ShardedOptimizer>(const ParamLayout& layout, const StoreGroup& group)>;

class GroupedStore final : public model::ParamStore {
 public:
  /// Collective over every group's communicator (in the order given). `across` is the communicator
  /// over which different ranks hold different blocks of a group (the expert-parallel group): the
  /// gradient norm and gather_params() sum expert parts over it. nullptr when every rank holds all.
  /// `tp`: the tensor-parallel group (the norms are summed over it); nullptr without.
  /// `make`: the engines (empty: a host ZeroEngine per group with cfg and precision).
  /// `frozen_memory`: the backend whose memory holds a frozen group, the one the engines keep their
  /// states in (must outlive this; nullptr: host memory).
  GroupedStore(const ParamLayout& schema, std::vector<StoreGroup> groups, const ZeroConfig& cfg,
               kernels::Precision precision, const comm::Communicator* across,
               const comm::Communicator* tp = nullptr, const EngineFactory& make = {},
               kernels::OpsBackend* frozen_memory = nullptr);
  ~GroupedStore() override;

  const ParamLayout& schema() const { return schema_; }
  bool holds(int block) const { return route_[block].engine >= 0 || route_[block].engine == kFrozen; }
  int engines() const { return static_cast<int>(parts_.size()); }
  ShardedOptimizer& engine(int i) { return *parts_[i].engine; }
  const ShardedOptimizer& engine(int i) const { return *parts_[i].engine; }

  // ---- ParamStore (block ids of the schema) ----
  const float* params(int block) override;
  float* grads(int block) override;
  void release(int block) override;
  const uint16_t* params_half(int block) override;
  const uint16_t* params16(int block) override;
  void grads_ready(int block) override;
  void grads_ready_half(int block, const uint16_t* g, size_t n, kernels::Precision p) override;

  // ---- the ShardedOptimizer protocol, over every engine (see sharded_optimizer.hpp) ----
  void init_params(const std::function<void(int block, float* dst)>& init);  // schema block ids
  void begin_step();
  void begin_micro_step(bool last);
  void end_micro_step();
  /// Collective: the global sum of squares (dense once, expert parts summed over `across`, then
  /// everything over `tp`, tensor-parallel replicas counted once).
  double grad_sumsq();
  double grad_zeros();
  void adam_step(const AdamParams& a);
  /// Every engine's step is local (ShardedOptimizer::step_is_local): another thread may run adam_step.
  bool step_is_local() const;
  /// The engine's regather of a schema block (after adam_step with regather_later), and whether
  /// any engine's does anything.
  void regather(int block);
  bool regathers() const;
  /// Every engine's ShardedOptimizer::set_before_gather, the hook called with schema block ids.
  void set_before_gather(std::function<void(int block)> hook);
  /// Every engine's ShardedOptimizer::release_gathered.
  void release_gathered();
  /// Pieces in the schema's flat indices; all ranks' pieces cover every schema element once.
  void visit_pieces(bool load, const std::function<void(const StatePiece&)>& fn);
  /// Every engine's pieces address its live host state (see ShardedOptimizer::pieces_are_live).
  bool pieces_are_live() const;
  void after_load();
  /// Collective: the full schema parameters on every rank (tests, export). Not for large models.
  std::vector<float> gather_params();

  int stage() const { return parts_[0].engine->stage(); }
  bool half() const { return parts_[0].engine->half(); }
  bool offloaded() const { return parts_[0].engine->offloaded(); }
  io::AioEngine swap_engine() const { return parts_[0].engine->swap_engine(); }
  ZeroMemory memory() const;           // summed over engines (working_peak: the sum of peaks)
  double bytes_sent() const;
  SwapTraffic swap_traffic() const;    // summed over engines
  double gather_wait_seconds() const;  // summed over engines
  /// Collective: ShardedOptimizer::state_sumsq over the whole schema (expert parts summed over `across`).
  std::array<double, 3> state_sumsq() const;
  double reduce_wait_seconds() const;
  long long gathers() const;
  size_t local_numel() const;          // this rank's shard elements, summed over engines

 private:
  // f over every engine, summed across groups and the tensor-parallel group as the norms are.
  double over_parts(const std::function<double(ShardedOptimizer&)>& f);
  struct Part {
    StoreGroup spec;
    std::unique_ptr<ParamLayout> layout;  // schema.subset(spec.blocks): the engine keeps a reference
    std::unique_ptr<ShardedOptimizer> engine;
  };
  struct Route {
    int engine = -1, local = -1;  // engine kFrozen: local indexes frozen_'s blocks
  };
  static constexpr int kFrozen = -2;
  std::unique_ptr<kernels::OpsBackend> host_;  // frozen blocks in host memory: the CPU backend's
  std::unique_ptr<FrozenBlocks> frozen_;       // nullptr: no frozen group
  const Route& at(int block) const;
  template <class F>
  auto sum_engines(F f) const {  // f(engine) summed over the engines
    decltype(f(*parts_[0].engine)) s{};
    for (const auto& p : parts_) s += f(*p.engine);
    return s;
  }

  const ParamLayout& schema_;
  const comm::Communicator* across_;
  const comm::Communicator* tp_;
  std::vector<Part> parts_;
  std::vector<Route> route_;  // schema block -> engine, its block there
};

}  // namespace hpct::parallel
