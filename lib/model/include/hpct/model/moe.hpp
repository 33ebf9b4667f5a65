// hpct/model/moe.hpp — the mixture-of-experts feed-forward as a component of its own: router, gate
// (moe_gate.hpp), dispatcher (the all-to-alls over the expert-parallel group, TED's duplicate
// token dropping) and experts (one Mlp each), with the routing records and traffic counters the
// trainer reports. docs/moe.md.
//
// It is: the feed-forward of the model's MoE layers, forward and backward over the N rows of one
// micro-batch, the layer's tensors located by its LayerTensors (gpt.hpp) and the parameters coming
// from the ParamStore (each expert its own block). Residual MoE's dense MLP beside the experts is
// handed in (Dense): the model owns those weights and activations as it owns a dense layer's.
// It is not: the layer around it (norms, attention, residual stream: Gpt), nor the gate's maths
// (moe_gate.hpp). What it keeps between a forward and its backward lives here, per activation set
// (and per MoE layer with communication-aware checkpointing).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hpct/comm/mpi.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/mlp.hpp"
#include "hpct/model/param_store.hpp"

namespace hpct::model {

struct GptConfig;
struct LayerTensors;
class TensorParallel;

/// Per MoE layer, summed over the micro-batches since the last reset: this rank's tokens.
struct MoeLayerStats {
  std::vector<long long> load;  // (E) routes kept per expert
  long long routes = 0, dropped = 0, micro_batches = 0;
  double aux_loss = 0, z_loss = 0;  // sums over micro-batches (unscaled)
  uint64_t routing_hash = 0;        // of every route's (token, expert, slot): tests see a flip
};

class Moe {
 public:
  /// cfg, ops, tp and mlp are the model's and must outlive this; ep: the expert-parallel group
  /// (nullptr: every expert here). dense_width: the dense MLP's width on this tensor-parallel rank.
  Moe(const GptConfig& cfg, kernels::OpsBackend& ops, TensorParallel& tp, const Mlp& mlp, const comm::Communicator* ep,
      int dense_width);
  ~Moe();
  Moe(const Moe&) = delete;
  Moe& operator=(const Moe&) = delete;

  /// What the model's current pass decides for every MoE layer in it.
  struct Pass {
    bool training = false;        // noise, the training capacity, RTS
    bool replaying = false;       // CAC's replay: recompute what backward reads, from the kept rows
    bool keep_per_layer = false;  // CAC in training: routing and exchanged rows kept per MoE layer
    float dloss = 0;              // d(loss)/d(token loss) of the micro-batch (aux and z losses' scale)
    int batch_rows = 0;           // B*T of the micro-batch (the aux losses' weight; random-LTD layers see fewer rows)
  };
  /// Residual MoE's dense MLP beside the experts (the model's: tensor-parallel like a dense layer's).
  struct Dense {
    MlpWeights w;
    MlpGrads g;                           // backward only
    float* fch = nullptr;                 // its saved activations (the layer's)
    float* fch_gelu = nullptr;
    float* dfch = nullptr;                // backward scratch
    float* dfch_gelu = nullptr;
    int width = 0;                        // its width on this tensor-parallel rank
  };

  /// x (N, C) -> out (N, C) for MoE layer `layer` (tensors o, its dense block's parameters lp);
  /// `set`: the activation set (one per layer, or one shared under recomputation).
  void forward(const Pass& p, ParamStore& store, const LayerTensors& o, int layer, const float* lp, const Dense& dense,
               const float* x, float* out, int N, int set);
  /// dout (N, C) -> dx (N, C) ACCUMULATED; the experts' gradients into their blocks (grads_ready
  /// each), the router's (and residual MoE's) into lg.
  void backward(const Pass& p, ParamStore& store, const LayerTensors& o, const float* lp, float* lg, const Dense& dense,
                const float* x, const float* dout, float* dx, int N, int set);

  /// Routing noise and random token selection of the next micro-batch derive from this seed.
  void set_routing_seed(uint64_t seed) { routing_seed_ = seed; }
  const std::vector<MoeLayerStats>& stats() const { return stats_; }
  void reset_stats() { stats_.clear(); }
  /// Bytes this rank sent to other ranks in the all-to-alls (rows and counts), the row all-to-alls
  /// issued, and what a ring moves per rank in the tensor-parallel collectives of TED.
  double alltoall_bytes() const { return alltoall_bytes_; }
  long long alltoall_calls() const { return alltoall_calls_; }
  double tp_bytes() const { return tp_bytes_; }
  /// TED's duplicate token dropping: tensor and expert parallelism together, unless disabled.
  bool drops_duplicate_tokens() const;
  /// Bytes kept per MoE layer for CAC's replay; forgetting them (the layout changed).
  size_t kept_bytes() const;
  void clear_kept();

 private:
  struct Acts;
  Acts& acts(int set);
  Acts& state(const LayerTensors& o, int set, bool keep_per_layer);
  int expert_width() const;
  void note_routing(int moe_index, int N, int K, const kernels::GateSummary& g);
  void exchange(const Acts& m, float* in, float* out, int C, bool to_experts, bool partial = false);
  void exchange_shares(const std::vector<int>& rin, const std::vector<int>& rout, float* in, float* out, int C,
                       bool partial);

  const GptConfig& cfg_;
  kernels::OpsBackend* ops_;
  TensorParallel& tp_;
  const Mlp& mlp_;
  const comm::Communicator* ep_;
  int ep_size_ = 1, ep_rank_ = 0, dense_width_ = 0;
  uint64_t routing_seed_ = 0;
  std::vector<MoeLayerStats> stats_;
  double alltoall_bytes_ = 0, tp_bytes_ = 0;
  long long alltoall_calls_ = 0;
  std::vector<std::unique_ptr<Acts>> acts_;  // per activation set (rows in the backend's memory)
  std::vector<std::unique_ptr<Acts>> kept_;  // CAC: one per MoE layer
};

}  // namespace hpct::model
