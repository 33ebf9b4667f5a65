// random-LTD inside the model (Yao et al. 2022; DeepSpeed's data_routing.random_ltd): a layer that
// drops tokens runs on a random, sorted subset of each sample's positions. See gpt.hpp.
//
// Forward: gather the kept rows of the layer's input (B samples x kept rows), run the layer on them
// as B sequences of `kept` tokens (the causal mask among sorted positions is the leading causal
// block, so the attention is exact; learned position embeddings were added before layer 0, rotary
// positions are each kept row's own: kept_rotary_positions), copy the
// input through to the output and scatter the layer's rows over it. Backward: the gradient of a
// dropped row passes through unchanged; the kept rows' gradient is gathered, runs through the
// layer's backward (from the kept input rows, gathered again), and is scattered back.
// Under sequence parallelism each tensor-parallel rank holds a slice of the rows: the slices are
// gathered into the whole stream first, the kept sub-batch is split over the ranks as any batch is
// (its B*kept rows must divide), and the layer's slices are gathered back before the scatter.
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
  ltd_rows_.resize(cfg_.num_layers);
  std::vector<int32_t>& rows = ltd_rows_[l];
  rows.resize(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) rows[i] = (int32_t)((i / (size_t)k) * (size_t)T) + idx[i];
  if (!ops_->host_memory()) ops_->copy_from_host(ws_->ltd_rows[l].as<void>(), rows.data(), rows.size() * sizeof(int32_t));
}

const int32_t* Gpt::kept_rows(int l) const {
  return ops_->host_memory() ? ltd_rows_[l].data() : ws_->ltd_rows[l].as<int32_t>();
}

// A kept row keeps its own position: rotary attention among the kept rows is the full model's
// attention with the dropped keys removed (learned positions were added before layer 0 instead).
const int32_t* Gpt::kept_rotary_positions(int l, int B, int T) {
  if (!cfg_.rotary) return nullptr;
  const size_t k = (size_t)ltd_kept_;
  const int32_t* idx = ltd_idx_[l].data();  // (B, k) sorted positions per sample
  ltd_pos_.resize((size_t)B * k);
  for (size_t i = 0; i < ltd_pos_.size(); ++i) {
    const size_t b = i / k;
    ltd_pos_[i] = cfg_.reset_position_ids ? doc_pos_[b * (size_t)T + (size_t)idx[i]] : idx[i];
  }
  if (ops_->host_memory()) return ltd_pos_.data();
  ops_->copy_from_host(ws_->ltd_pos.as<void>(), ltd_pos_.data(), ltd_pos_.size() * sizeof(int32_t));
  return ws_->ltd_pos.as<int32_t>();
}

// The row moves run on the backend (gather_rows / scatter_rows), so random-LTD runs where the model does.
void Gpt::gather_kept(int l, const float* full, float* sub, int B) const {
  ops_->gather_rows(sub, full, kept_rows(l), (size_t)B * ltd_kept_, cfg_.hidden_size);
}

void Gpt::scatter_kept(int l, const float* sub, float* full, int B) const {
  ops_->scatter_rows(full, sub, kept_rows(l), (size_t)B * ltd_kept_, cfg_.hidden_size);
}

// Sequence parallelism: this rank's rows of a (N, C) stream into `full` at their place, then every
// rank's (the whole stream); without it, the rows themselves.
float* Gpt::whole_stream(const float* mine, float* full, size_t N) {
  if (!tp_.sequence_parallel()) return const_cast<float*>(mine);
  const size_t C = cfg_.hidden_size;
  ops_->copy(full + tp_.first_row(N) * C, mine, tp_.local_rows(N) * C * sizeof(float));
  tp_.all_gather(full, N * C);
  return full;
}

// The first of this rank's rows of the kept sub-batch (B*kept rows, split as any batch is).
size_t Gpt::kept_first_row(int B) const {
  const size_t Nk = (size_t)B * ltd_kept_;
  if (tp_.sequence_parallel() && Nk % (size_t)tp_.size() != 0)
    throw config_error("--sequence-parallel", "random-LTD keeps " + std::to_string(ltd_kept_) + " tokens of each of " +
                                                  std::to_string(B) + " samples, " + std::to_string(Nk) +
                                                  " rows that do not split over " + std::to_string(tp_.size()) +
                                                  " sequence-parallel ranks",
                       "make micro-batch x kept tokens a multiple of --tensor-model-parallel-size");
  return tp_.first_row(Nk);
}

void Gpt::run_layer_forward(ParamStore& store, int l, const float* lp, LayerActs& a, const float* in, float* out, int B,
                            int T, bool fresh) {
  if (!drops_tokens(l, T)) return layer_forward(store, l, lp, a, in, out, B, T, key_start_, positions_);
  if (fresh) choose_kept(l, B, T);
  const size_t N = (size_t)B * T, C = cfg_.hidden_size, NC = N * C;
  float* sub_in = ws_->ltd;
  float* sub_out = ws_->ltd + NC;
  const float* full_in = whole_stream(in, ws_->ltd + 3 * NC, N);
  gather_kept(l, full_in, sub_in, B);
  const size_t r0 = kept_first_row(B) * C;  // this rank's rows of the kept sub-batch (all without SP)
  layer_forward(store, l, lp, a, sub_in + r0, sub_out + r0, B, ltd_kept_, kept_key_start(l, B, T),
                kept_rotary_positions(l, B, T));
  if (replaying_) return;  // CAC's replay computes what backward reads only, not the output
  tp_.all_gather(sub_out, (size_t)B * ltd_kept_ * C);  // the other ranks' rows (SP only)
  float* full_out = tp_.sequence_parallel() ? ws_->ltd + 4 * NC : out;
  ops_->copy(full_out, full_in, NC * sizeof(float));
  scatter_kept(l, sub_out, full_out, B);
  if (full_out != out) ops_->copy(out, full_out + tp_.first_row(N) * C, tp_.local_rows(N) * C * sizeof(float));
}

void Gpt::run_layer_backward(ParamStore& store, int l, const float* lp, float* lg, LayerActs& a, const float* in,
                             float* dres, int B, int T) {
  if (!drops_tokens(l, T)) return layer_backward(store, l, lp, lg, a, in, dres, B, T, positions_);
  const size_t N = (size_t)B * T, C = cfg_.hidden_size, NC = N * C;
  float* sub_in = ws_->ltd;
  float* sub_d = ws_->ltd + 2 * NC;
  const float* full_in = whole_stream(in, ws_->ltd + 3 * NC, N);
  float* full_d = whole_stream(dres, ws_->ltd + 4 * NC, N);
  gather_kept(l, full_in, sub_in, B);
  gather_kept(l, full_d, sub_d, B);
  const size_t r0 = kept_first_row(B) * C;
  layer_backward(store, l, lp, lg, a, sub_in + r0, sub_d + r0, B, ltd_kept_, kept_rotary_positions(l, B, T));
  tp_.all_gather(sub_d, (size_t)B * ltd_kept_ * C);
  scatter_kept(l, sub_d, full_d, B);  // dropped rows: d(input) = d(output), already in place
  if (full_d != dres) ops_->copy(dres, full_d + tp_.first_row(N) * C, tp_.local_rows(N) * C * sizeof(float));
}

}  // namespace hpct::model
