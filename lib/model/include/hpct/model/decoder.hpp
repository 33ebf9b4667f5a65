// hpct/model/decoder.hpp — the GPT's forward for text generation, with a key/value cache.
//
// What it is: inference for a GPT (the same parameter table, read through Gpt::layout_for's
// GptTensors, and the same components as model/gpt.hpp's forward: norms, attention projections,
// MLPs; fp32 on the CPU ops) over several sequences at once, each with its own cache of every
// layer's keys and values. extend() runs new tokens of one sequence (a prompt: its rows attend to
// the cache and causally to each other), step() one new token of each of several sequences
// (batched GEMMs, each row attending to its own sequence's cache). Either way each token costs its
// own rows only: the positions before it are read from the cache, not recomputed.
// MoE layers route each token to its top-k experts with the model's evaluation gate (no noise;
// top-2's second expert the second-largest logit) and keep every route: a token's output does not
// depend on which other tokens share the step (DeepSpeed's inference does not drop either), so a
// cached step equals a full pass. The training model's forward equals it when nothing is dropped.
// What it is not: a training path (no activations kept, no backward), tensor parallel, expert
// parallel (one process holds every expert), or GPU-resident (kernels::cpu ops; the parameters
// and caches are host memory).
// Memory: the cache holds 2 x L x sequences x positions() x KV d floats (C without grouped-query
// attention: the cache keeps the key/value heads only), allocated up front (cache_bytes()).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hpct/model/gpt.hpp"

namespace hpct::model {

class Decoder {
 public:
  /// params: the flat fp32 parameters of Gpt::layout_for(cfg) in host memory (must outlive the
  /// decoder); sequences: how many caches. Throws for a tensor-parallel config. Needs a
  /// kernels::BackendScope alive while it runs, as the CPU ops do.
  Decoder(const GptConfig& cfg, const float* params, int sequences);

  /// Appends n tokens to sequence s (positions length(s) .. length(s)+n-1, which must stay below
  /// cfg.positions()). logits: (n, Vp) for every new position if all_rows, else (Vp) for the last
  /// one only; nullptr for none.
  void extend(int s, const int32_t* tokens, int n, float* logits, bool all_rows = false);
  /// One new token for each of k sequences seqs[0..k) (distinct), batched: logits (k, Vp).
  void step(const int* seqs, const int32_t* tokens, int k, float* logits);

  int length(int s) const { return len_.at(s); }
  /// Forgets sequence s (its next token is position 0).
  void clear(int s) { len_.at(s) = 0; }
  /// Sequence to becomes a copy of sequence from (its cached keys and values and its length), as a
  /// beam search continues one hypothesis in several slots.
  void copy(int from, int to);
  int sequences() const { return static_cast<int>(len_.size()); }
  const GptConfig& config() const { return cfg_; }
  size_t cache_bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  struct Row {
    int seq, pos;
  };
  // Runs the rows (tokens[r] at rows[r]), writes each row's k/v into the cache, and the logits of
  // the rows listed in out_rows.
  void run(const std::vector<Row>& rows, const int32_t* tokens, const std::vector<int>& out_rows, float* logits);
  void attend(const std::vector<Row>& rows, int layer);  // atty_ from qkv_ and the cache
  // An MLP on R rows of in into out.
  void mlp(const MlpWeights& w, const float* in, float* out, int R);
  // Layer l's mixture of experts on R rows of ln_ into out.
  void moe(int l, int R, float* out);
  // A schema block's parameters.
  const float* block(int b) const { return p_ + layout_.blocks()[b].offset; }
  float* kcache(int layer, int seq, int pos) { return k_.data() + (((size_t)layer * len_.size() + seq) * T_ + pos) * KVC_; }
  float* vcache(int layer, int seq, int pos) { return v_.data() + (((size_t)layer * len_.size() + seq) * T_ + pos) * KVC_; }

  GptConfig cfg_;
  const float* p_;
  int C_, T_, L_, NH_, Vp_;
  ParamLayout layout_;
  GptTensors t_;  // where each tensor lies in layout_
  std::unique_ptr<kernels::OpsBackend> ops_;  // the CPU ops
  Norm norm_;
  Attention attention_;
  Mlp mlp_;
  std::vector<int> len_;
  int KVC_ = 0;                // the key (and value) channels: KV heads x d
  std::vector<float> k_, v_;  // (L, sequences, T, KVC)
  // Working rows, grown to the largest call.
  std::vector<float> x_, ln_, qkv_, atty_, res_, fch_, fcg_, mean_, rstd_, scores_;
  std::vector<float> logits_, erows_, ey_, dense_, coef_;  // MoE layers
  std::vector<int32_t> pos_;  // each row's position (rotary positions)
};

}  // namespace hpct::model
