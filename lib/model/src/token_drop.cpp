// random-LTD inside the model (Yao et al. 2022; DeepSpeed's data_routing.random_ltd): a layer that
// drops tokens runs on a random, sorted subset of each sample's positions. See gpt.hpp.
//
// Forward: gather the kept rows of the layer's input (B samples x kept rows), run the layer on them
// as B sequences of `kept` tokens (the causal mask among sorted positions is the leading causal
// block, so the attention is exact; the position embeddings were added before layer 0), copy the
// input through to the output and scatter the layer's rows over it. Backward: the gradient of a
// dropped row passes through unchanged; the kept rows' gradient is gathered, runs through the
// layer's backward (from the kept input rows, gathered again), and is scattered back.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "gpt_acts.hpp"

namespace hpct::model {

void Gpt::set_random_ltd_layers(std::vector<int> layers) {
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  for (int l : layers)
    if (l < 0 || l >= cfg_.num_layers)
      throw config_error("random_ltd_layer_id", "random-LTD layer " + std::to_string(l) + " is not a layer of this " +
                                                    std::to_string(cfg_.num_layers) + "-layer model",
                         "give layer indices from 0 to " + std::to_string(cfg_.num_layers - 1));
  if (!layers.empty() && tp_.sequence_parallel())
    throw config_error("--sequence-parallel", "random-LTD does not combine with --sequence-parallel in this version "
                                              "(a sample's kept rows would span the tensor-parallel ranks' slices)",
                       "drop --sequence-parallel, or disable data_routing.random_ltd");
  if (!layers.empty() && !ops_->host_memory())
    throw config_error("--device", "random-LTD runs on the CPU backend only in this version (--device " + ops_->name() + ")",
                       "train with --device cpu, or disable data_routing.random_ltd");
  ltd_layers_ = std::move(layers);
  ltd_idx_.assign(cfg_.num_layers, {});
  ws_.reset();  // the next step allocates the kept rows' buffers
}

bool Gpt::drops_tokens(int l, int T) const {
  return training_ && ltd_kept_ > 0 && ltd_kept_ < T && std::binary_search(ltd_layers_.begin(), ltd_layers_.end(), l);
}

std::vector<int> Gpt::kept_positions(int layer, int b) const {
  if (layer < 0 || layer >= (int)ltd_idx_.size() || ltd_idx_[layer].empty() || b < 0 || b >= ltd_B_) return {};
  const auto& idx = ltd_idx_[layer];
  const size_t k = idx.size() / ltd_B_;
  return std::vector<int>(idx.begin() + (size_t)b * k, idx.begin() + (size_t)(b + 1) * k);
}

void Gpt::choose_kept(int l, int B, int T) {
  const int k = ltd_kept_;
  std::vector<int32_t>& idx = ltd_idx_[l];
  idx.resize((size_t)B * k);
  std::vector<int32_t> perm(T);
  for (int b = 0; b < B; ++b) {
    // A partial Fisher-Yates shuffle: the first k entries are a uniform k-subset, then sorted.
    Rng rng(mix_seed(ltd_seed_, static_cast<uint64_t>(ltd_first_ + b), static_cast<uint64_t>(l)));
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = 0; i < k; ++i) std::swap(perm[i], perm[i + rng.below(T - i)]);
    std::sort(perm.begin(), perm.begin() + k);
    std::copy_n(perm.begin(), k, idx.begin() + (size_t)b * k);
  }
  ltd_B_ = B;
}

void Gpt::gather_kept(int l, const float* full, float* sub, int B, int T) const {
  const size_t C = cfg_.hidden_size, k = ltd_kept_;
  const int32_t* idx = ltd_idx_[l].data();
  for (int b = 0; b < B; ++b)
    for (size_t j = 0; j < k; ++j)
      std::memcpy(sub + ((size_t)b * k + j) * C, full + ((size_t)b * T + idx[b * k + j]) * C, C * sizeof(float));
}

void Gpt::scatter_kept(int l, const float* sub, float* full, int B, int T) const {
  const size_t C = cfg_.hidden_size, k = ltd_kept_;
  const int32_t* idx = ltd_idx_[l].data();
  for (int b = 0; b < B; ++b)
    for (size_t j = 0; j < k; ++j)
      std::memcpy(full + ((size_t)b * T + idx[b * k + j]) * C, sub + ((size_t)b * k + j) * C, C * sizeof(float));
}

void Gpt::run_layer_forward(ParamStore& store, int l, const float* lp, LayerActs& a, const float* in, float* out, int B,
                            int T, bool fresh) {
  if (!drops_tokens(l, T)) return layer_forward(store, l, lp, a, in, out, B, T, key_start_);
  if (fresh) choose_kept(l, B, T);
  const size_t NC = (size_t)B * T * cfg_.hidden_size;
  float* sub_in = ws_->ltd;
  float* sub_out = ws_->ltd + NC;
  gather_kept(l, in, sub_in, B, T);
  layer_forward(store, l, lp, a, sub_in, sub_out, B, ltd_kept_, kept_key_start(l, B, T));
  if (replaying_) return;  // CAC's replay computes what backward reads only, not the output
  std::memcpy(out, in, NC * sizeof(float));
  scatter_kept(l, sub_out, out, B, T);
}

void Gpt::run_layer_backward(ParamStore& store, int l, const float* lp, float* lg, LayerActs& a, const float* in,
                             float* dres, int B, int T) {
  if (!drops_tokens(l, T)) return layer_backward(store, l, lp, lg, a, in, dres, B, T);
  const size_t NC = (size_t)B * T * cfg_.hidden_size;
  float* sub_in = ws_->ltd;
  float* sub_d = ws_->ltd + 2 * NC;
  gather_kept(l, in, sub_in, B, T);
  gather_kept(l, dres, sub_d, B, T);
  layer_backward(store, l, lp, lg, a, sub_in, sub_d, B, ltd_kept_);
  scatter_kept(l, sub_d, dres, B, T);  // dropped rows: d(input) = d(output), already in place
}

}  // namespace hpct::model
