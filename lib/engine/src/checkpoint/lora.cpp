// Folding LoRA adapters into their base (see lora.hpp).
#include "hpct/engine/checkpoint/lora.hpp"

#include <algorithm>

#include "hpct/core/error.hpp"

namespace hpct::engine {

void merge_lora(const model::GptConfig& lora, const std::vector<float>& adapters, const model::GptConfig& base_cfg,
                std::vector<float>& base, const std::string& base_flag) {
  auto same = [&](const char* what, long long a, long long b) {
    if (a != b)
      throw config_error(base_flag, std::string("the adapters were trained on a model with ") + what + " " + std::to_string(a) +
                                        ", the base has " + std::to_string(b),
                         "give the base model the LoRA run started from");
  };
  same("layers", lora.num_layers, base_cfg.num_layers);
  same("hidden size", lora.hidden_size, base_cfg.hidden_size);
  same("heads", lora.num_heads, base_cfg.num_heads);
  const ParamLayout stored = model::Gpt::layout_for(lora).trained(), layout = model::Gpt::layout_for(base_cfg);
  if (adapters.size() != stored.numel() || base.size() != layout.numel())
    throw Error("merge_lora: " + std::to_string(adapters.size()) + " adapter and " + std::to_string(base.size()) +
                " base values for layouts of " + std::to_string(stored.numel()) + " and " + std::to_string(layout.numel()));
  const double s = lora.lora.scale();
  const int r = lora.lora.rank;
  for (const auto& t : stored.tensors()) {  // modules saved in full (--lora-modules-to-save) replace the base's
    if (t.name.find(".lora_") != std::string::npos) continue;
    const TensorSpec& w = layout.find(t.name);
    if (w.shape != t.shape) throw Error("merge_lora: " + t.name + " is " + shape_string(t.shape) + ", the base's " + shape_string(w.shape));
    std::copy_n(adapters.begin() + static_cast<std::ptrdiff_t>(t.offset), t.numel, base.begin() + static_cast<std::ptrdiff_t>(w.offset));
  }
  for (const auto& a : stored.tensors()) {
    const size_t at = a.name.find(".lora_a.weight");
    if (at == std::string::npos) continue;
    const std::string linear = a.name.substr(0, at);
    const TensorSpec& b = stored.find(linear + ".lora_b.weight");
    const TensorSpec& w = layout.find(linear + ".weight");
    const int64_t rows = w.shape[0], cols = w.shape[1];
    // A linear's W (out, in) += s B A, B (out, r), A (r, in); the embedding's E (Vp, C) += s A B^T,
    // A (Vp, r), B (C, r). Either way W[i][j] += s sum_k L[i][k] R[k][j], R read with strides.
    const bool emb = linear == "embedding.word_embeddings";
    const std::vector<int64_t> want_a = emb ? std::vector<int64_t>{rows, r} : std::vector<int64_t>{r, cols};
    const std::vector<int64_t> want_b = emb ? std::vector<int64_t>{cols, r} : std::vector<int64_t>{rows, r};
    if (a.shape != want_a || b.shape != want_b)
      throw Error("merge_lora: " + linear + "'s adapters " + shape_string(a.shape) + " and " + shape_string(b.shape) +
                  " do not fit its weight " + shape_string(w.shape));
    const float* L = adapters.data() + (emb ? a.offset : b.offset);  // (rows, r)
    const float* R = adapters.data() + (emb ? b.offset : a.offset);
    const int64_t rk = emb ? 1 : cols, rj = emb ? r : 1;           // R[k][j] = R[k * rk + j * rj]
    float* W = base.data() + w.offset;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double d = 0;
        for (int k = 0; k < r; ++k) d += static_cast<double>(L[i * r + k]) * R[k * rk + j * rj];
        W[i * cols + j] = static_cast<float>(W[i * cols + j] + s * d);
      }
  }
}

}  // namespace hpct::engine
