// LoRA adapters on the GPT's linears: the adapted model starts as its base, the adapters' backward
// matches finite differences, and their gradients are exactly what the merged model's weight
// gradient implies (dB = s G A^T, dA = s B^T G for y = x (W + s B A)^T), which is also the check
// of the merge formula hpct_ckpt merge-lora uses.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/model/gpt.hpp"
#include "gpt_test_models.hpp"

using namespace hpct;

namespace {

const char* kLinear[4] = {"attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"};
constexpr unsigned kAll = 0x1F;  // the four linears and the embedding

// llama: RMSNorm, SwiGLU MLPs 24 wide (fc's LoRA B is then 48 x rank: gate and up), no linear biases,
// rotary positions (the qkv adapter's output is rotated with the base's).
model::GptConfig tiny(int rank = 0, unsigned targets = 0xF, bool llama = false) {
  model::GptConfig c = test::tiny();
  if (llama)
    c.normalization = model::NormKind::rmsnorm, c.mlp = model::MlpKind::swiglu, c.ffn_hidden_size = 24, c.linear_bias = false,
    c.rotary = true, c.num_kv_heads = 1;
  c.lora.rank = rank;
  c.lora.alpha = rank ? 2.0 * rank : 0;  // scale 2: a scale other than 1 is exercised
  c.lora.targets = targets;
  return c;
}

struct Batch {
  static constexpr int B = 2, T = 6;
  std::vector<int32_t> tok = std::vector<int32_t>(B * T), tgt = std::vector<int32_t>(B * T);
  Batch() {
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % 23, tgt[i] = (i * 5 + 1) % 23;
    tgt[4] = -1;
  }
};

// The LoRA model's parameters: the base's by name, the adapters as initialised, and the factor
// that starts at zero (a linear's B, the embedding's A) random unless zero_b (the adapted model
// then is the base).
std::vector<float> lora_params(const model::Gpt& m, const model::Gpt& base, const std::vector<float>& bp, bool zero_b) {
  std::vector<float> p(m.layout().numel());
  m.init_params(p.data(), 5);
  for (const auto& t : base.layout().tensors())
    std::copy_n(bp.begin() + t.offset, t.numel, p.begin() + m.layout().find(t.name).offset);
  Rng rng(77);
  if (!zero_b)
    for (const auto& t : m.layout().tensors())
      if (t.name.find(".lora_") != std::string::npos && p[t.offset] == 0.0f && p[t.offset + t.numel - 1] == 0.0f)
        for (size_t k = 0; k < t.numel; ++k) p[t.offset + k] = static_cast<float>(0.3 * rng.normal());
  return p;
}

// d loss / d p[i] by central differences (the store reads p).
double central_difference(model::Gpt& m, model::ParamStore& st, std::vector<float>& p, size_t i, float eps, Batch& d) {
  const float keep = p[i];
  p[i] = keep + eps;
  const double lp = m.forward_loss(st, d.tok.data(), d.tgt.data(), d.B, d.T);
  p[i] = keep - eps;
  const double lm = m.forward_loss(st, d.tok.data(), d.tgt.data(), d.B, d.T);
  p[i] = keep;
  return (lp - lm) / (2 * eps);
}

}  // namespace

// B starts at zero: the adapted model's loss and every base-model output are the base's, bitwise.
TEST(Lora, StartsAsTheBase) {
  Batch d;
  model::Gpt base(tiny(), kernels::Precision::fp32, false), m(tiny(4, kAll), kernels::Precision::fp32, false);
  std::vector<float> bp(base.layout().numel()), bg(bp.size());
  base.init_params(bp.data(), 3);
  std::vector<float> p = lora_params(m, base, bp, /*zero_b=*/true), g(p.size());
  model::FlatParamStore bs(base.layout(), bp.data(), bg.data()), ls(m.layout(), p.data(), g.data());
  EXPECT_EQ(base.forward_loss(bs, d.tok.data(), d.tgt.data(), d.B, d.T), m.forward_loss(ls, d.tok.data(), d.tgt.data(), d.B, d.T));
}

// Every base block is frozen (the store gives it no gradient); the adapters' blocks train.
TEST(Lora, OnlyTheAdaptersTrain) {
  model::Gpt m(tiny(4), kernels::Precision::fp32, false);
  int adapters = 0;
  for (const auto& b : m.layout().blocks()) {
    const bool lora = b.name.size() > 5 && b.name.substr(b.name.size() - 5) == ".lora";
    EXPECT_EQ(b.trains, lora) << b.name;
    adapters += lora;
  }
  EXPECT_EQ(adapters, 2);
  const ParamLayout stored = m.layout().trained();
  // qkv: 4x16 + 48x4; proj: 4x16 + 16x4; fc: 4x16 + 64x4; fc2: 4x64 + 16x4 = 1024 per layer
  EXPECT_EQ(stored.numel(), 2u * 1024u);
  EXPECT_EQ(stored.tensors().size(), 16u);
  EXPECT_NO_THROW(stored.find("layers.1.mlp.dense_4h_to_h.lora_a.weight"));
  EXPECT_EQ(stored.find("layers.1.mlp.dense_4h_to_h.lora_a.weight").shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(stored.find("layers.0.attention.query_key_value.lora_b.weight").shape, (std::vector<int64_t>{48, 4}));
}

// The adapters' gradients against central differences of the loss (fp32; step 1e-2, tolerance as
// test_gpt's whole-model check: 5e-3 absolute + 3% relative covers the O(eps^2) truncation and the
// fp32 rounding of a loss of ~3), with and without recompute, for every target, for two linears,
// and for the embedding alone.
TEST(Lora, BackwardMatchesFiniteDifferences) {
  Batch d;
  for (unsigned targets : {kAll, 0x9u, 0x10u})
    for (bool recompute : {false, true}) {
      model::Gpt base(tiny(), kernels::Precision::fp32, false), m(tiny(3, targets), kernels::Precision::fp32, recompute);
      std::vector<float> bp(base.layout().numel());
      base.init_params(bp.data(), 3);
      std::vector<float> p = lora_params(m, base, bp, false), g(p.size(), 0.0f), dummy(p.size());
      model::FlatParamStore st(m.layout(), p.data(), g.data()), fst(m.layout(), p.data(), dummy.data());
      m.forward_backward(st, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
      int checked = 0, bad = 0;
      for (const auto& t : m.layout().tensors()) {
        if (t.name.find(".lora_") == std::string::npos) continue;
        for (size_t k = 0; k < t.numel; k += std::max<size_t>(1, t.numel / 7)) {
          const size_t i = t.offset + k;
          // The embedding's B is N(0, 1) (PEFT's): a step in its A moves E ~50x more than a step
          // in a linear's adapter moves W, so it gets a smaller step (fp32 noise ~1e-6 / 4e-3).
          const float eps = t.name.rfind("embedding.", 0) == 0 ? 2e-3f : 1e-2f;
          const double fd = central_difference(m, fst, p, i, eps, d);
          ++checked;
          if (std::fabs(fd - g[i]) > 5e-3 + 3e-2 * std::fabs(fd) && bad++ < 8)
            ADD_FAILURE() << t.name << "[" << k << "] analytic " << g[i] << " fd " << fd << " recompute " << recompute;
        }
      }
      EXPECT_GE(checked, targets == kAll ? 100 : 16);
      EXPECT_EQ(bad, 0);
    }
}

// The adapted model is the base with W + s B A (the merge; the embedding E + s A B^T): same loss,
// and the adapters' gradients follow from the merged weight's gradient G: dB = s G A^T,
// dA = s B^T G (the embedding: dA = s G B, dB = s G^T A). fp32 sums in different orders: 1e-5
// relative on the loss, 1e-4 of the largest entry on the gradients.
void check_merged(bool llama) {
  Batch d;
  const model::GptConfig cfg = tiny(3, kAll, llama);
  const double s = cfg.lora.scale();
  model::Gpt base(tiny(0, 0xF, llama), kernels::Precision::fp32, false), m(cfg, kernels::Precision::fp32, false);
  std::vector<float> bp(base.layout().numel());
  base.init_params(bp.data(), 3);
  std::vector<float> p = lora_params(m, base, bp, false), g(p.size(), 0.0f);
  model::FlatParamStore ls(m.layout(), p.data(), g.data());
  const double loss = m.forward_backward(ls, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
  // merged = base with W += s B A on every adapted linear
  std::vector<float> mp = bp, mg(mp.size(), 0.0f);
  const int r = cfg.lora.rank;
  auto at = [&](const model::Gpt& x, const std::string& n) { return x.layout().find(n).offset; };
  for (int l = 0; l < cfg.num_layers; ++l)
    for (const char* lin : kLinear) {
      const std::string pre = "layers." + std::to_string(l) + "." + lin;
      const auto& w = base.layout().find(pre + ".weight");
      const int out = (int)w.shape[0], in = (int)w.shape[1];
      const float* A = p.data() + at(m, pre + ".lora_a.weight");
      const float* Bm = p.data() + at(m, pre + ".lora_b.weight");
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) {
          double acc = 0;
          for (int k = 0; k < r; ++k) acc += (double)Bm[o * r + k] * A[k * in + i];
          mp[w.offset + (size_t)o * in + i] += static_cast<float>(s * acc);
        }
    }
  {  // the embedding: E (Vp, C) += s A B^T
    const auto& e = base.layout().find("embedding.word_embeddings.weight");
    const int V = (int)e.shape[0], C = (int)e.shape[1];
    const float* A = p.data() + at(m, "embedding.word_embeddings.lora_a.weight");
    const float* Bm = p.data() + at(m, "embedding.word_embeddings.lora_b.weight");
    for (int v = 0; v < V; ++v)
      for (int c = 0; c < C; ++c) {
        double acc = 0;
        for (int k = 0; k < r; ++k) acc += (double)A[v * r + k] * Bm[c * r + k];
        mp[e.offset + (size_t)v * C + c] += static_cast<float>(s * acc);
      }
  }
  model::FlatParamStore ms(base.layout(), mp.data(), mg.data());
  const double merged = base.forward_backward(ms, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
  EXPECT_NEAR(loss, merged, 1e-5 * std::fabs(merged));
  for (int l = 0; l < cfg.num_layers; ++l)
    for (const char* lin : kLinear) {
      const std::string pre = "layers." + std::to_string(l) + "." + lin;
      const auto& w = base.layout().find(pre + ".weight");
      const int out = (int)w.shape[0], in = (int)w.shape[1];
      const float* G = mg.data() + w.offset;
      const float* A = p.data() + at(m, pre + ".lora_a.weight");
      const float* Bm = p.data() + at(m, pre + ".lora_b.weight");
      const float* dA = g.data() + at(m, pre + ".lora_a.weight");
      const float* dB = g.data() + at(m, pre + ".lora_b.weight");
      std::vector<double> wantA((size_t)r * in, 0.0), wantB((size_t)out * r, 0.0);
      double scale = 0;
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i)
          for (int k = 0; k < r; ++k) {
            wantB[(size_t)o * r + k] += s * G[(size_t)o * in + i] * A[k * in + i];
            wantA[(size_t)k * in + i] += s * Bm[o * r + k] * G[(size_t)o * in + i];
          }
      for (double v : wantA) scale = std::max(scale, std::fabs(v));
      for (double v : wantB) scale = std::max(scale, std::fabs(v));
      ASSERT_GT(scale, 1e-6) << pre;  // a gradient that could be wrong
      for (size_t k = 0; k < wantA.size(); ++k) ASSERT_NEAR(dA[k], wantA[k], 1e-4 * scale) << pre << ".lora_a[" << k << "]";
      for (size_t k = 0; k < wantB.size(); ++k) ASSERT_NEAR(dB[k], wantB[k], 1e-4 * scale) << pre << ".lora_b[" << k << "]";
    }
  const auto& e = base.layout().find("embedding.word_embeddings.weight");
  const int V = (int)e.shape[0], C = (int)e.shape[1];
  const float* G = mg.data() + e.offset;
  const float* A = p.data() + at(m, "embedding.word_embeddings.lora_a.weight");
  const float* Bm = p.data() + at(m, "embedding.word_embeddings.lora_b.weight");
  const float* dA = g.data() + at(m, "embedding.word_embeddings.lora_a.weight");
  const float* dB = g.data() + at(m, "embedding.word_embeddings.lora_b.weight");
  std::vector<double> wantA((size_t)V * r, 0.0), wantB((size_t)C * r, 0.0);
  double scale = 0;
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c)
      for (int k = 0; k < r; ++k) {
        wantA[(size_t)v * r + k] += s * G[(size_t)v * C + c] * Bm[c * r + k];
        wantB[(size_t)c * r + k] += s * G[(size_t)v * C + c] * A[v * r + k];
      }
  for (double v : wantA) scale = std::max(scale, std::fabs(v));
  for (double v : wantB) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 1e-6);
  for (size_t k = 0; k < wantA.size(); ++k) ASSERT_NEAR(dA[k], wantA[k], 1e-4 * scale) << "embedding lora_a[" << k << "]";
  for (size_t k = 0; k < wantB.size(); ++k) ASSERT_NEAR(dB[k], wantB[k], 1e-4 * scale) << "embedding lora_b[" << k << "]";
}

TEST(Lora, EqualsTheMergedModel) { check_merged(false); }
TEST(Lora, EqualsTheMergedModelWithRmsNormAndSwiGlu) { check_merged(true); }

// --lora-modules-to-save: the named base blocks train in full and are stored with the adapters.
TEST(Lora, ModulesToSaveTrainInFull) {
  model::GptConfig c = tiny(4);
  c.lora.modules_to_save = model::LoraConfig::parse_modules("final_layernorm,embedding");
  model::Gpt m(c, kernels::Precision::fp32, false);
  for (const auto& b : m.layout().blocks())
    EXPECT_EQ(b.trains, b.name == "embedding" || b.name == "final_norm" || b.name.find(".lora") != std::string::npos) << b.name;
  const ParamLayout stored = m.layout().trained();
  EXPECT_NO_THROW(stored.find("final_layernorm.bias"));
  EXPECT_NO_THROW(stored.find("embedding.word_embeddings.weight"));
  EXPECT_THROW(stored.find("layers.0.attention.dense.weight"), Error);
  EXPECT_THROW(model::LoraConfig::parse_modules("lm_head"), Error);
}

// --lora-modules-to-save position_embedding: the learned positions train in a block of their own,
// the word embedding stays frozen. Their gradient equals the base model's bitwise when the adapters
// start at B = 0 (the adapted model is then the base and its backward adds exact zeros), and
// matches central differences when they do not (step and tolerance as in the adapters' check).
TEST(Lora, PositionEmbeddingTrainsAlone) {
  Batch d;
  model::GptConfig c = tiny(4);
  c.lora.modules_to_save = model::LoraConfig::parse_modules("position_embedding");
  model::Gpt base(tiny(), kernels::Precision::fp32, false), m(c, kernels::Precision::fp32, false);
  for (const auto& b : m.layout().blocks())
    EXPECT_EQ(b.trains, b.name == "embedding.position" || b.name.find(".lora") != std::string::npos) << b.name;
  const ParamLayout stored = m.layout().trained();
  EXPECT_NO_THROW(stored.find("embedding.position_embeddings.weight"));
  EXPECT_THROW(stored.find("embedding.word_embeddings.weight"), Error);
  const char* kWpe = "embedding.position_embeddings.weight";
  const TensorSpec &bw = base.layout().find(kWpe), &lw = m.layout().find(kWpe);

  std::vector<float> bp(base.layout().numel()), bg(bp.size(), 0.0f);
  base.init_params(bp.data(), 3);
  std::vector<float> p = lora_params(m, base, bp, /*zero_b=*/true), g(p.size(), 0.0f);
  model::FlatParamStore bs(base.layout(), bp.data(), bg.data()), ls(m.layout(), p.data(), g.data());
  base.forward_backward(bs, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
  m.forward_backward(ls, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
  ASSERT_EQ(lw.numel, bw.numel);
  for (size_t k = 0; k < lw.numel; ++k) ASSERT_EQ(g[lw.offset + k], bg[bw.offset + k]) << "wpe[" << k << "]";

  p = lora_params(m, base, bp, /*zero_b=*/false);
  std::fill(g.begin(), g.end(), 0.0f);
  std::vector<float> dummy(p.size());
  model::FlatParamStore st(m.layout(), p.data(), g.data()), fst(m.layout(), p.data(), dummy.data());
  m.forward_backward(st, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
  int bad = 0;
  for (size_t k = 0; k < lw.numel; k += 5) {
    const size_t i = lw.offset + k;
    const double fd = central_difference(m, fst, p, i, 1e-2f, d);
    if (std::fabs(fd - g[i]) > 5e-3 + 3e-2 * std::fabs(fd) && bad++ < 8)
      ADD_FAILURE() << "wpe[" << k << "] analytic " << g[i] << " fd " << fd;
  }
  EXPECT_EQ(bad, 0);
}

TEST(Lora, BadSettingsNameTheFlag) {
  auto fails_with = [](model::GptConfig c, const std::string& flag) {
    try {
      c.validate();
      ADD_FAILURE() << "accepted " << flag;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  model::GptConfig c = tiny(4);
  c.moe.num_experts = {2};
  fails_with(c, "--lora-rank");
  c = tiny(4, 0);
  fails_with(c, "--lora-targets");
  EXPECT_THROW(model::LoraConfig::parse_targets("qkv,mlp"), Error);
  EXPECT_EQ(model::LoraConfig::parse_targets("fc2,qkv"), 0x9u);
  // CAC's replay would skip the adapters' products of proj and fc2: refused with recomputation.
  model::Gpt recompute(tiny(4), kernels::Precision::fp32, true);
  try {
    recompute.set_communication_aware_checkpointing(true);
    ADD_FAILURE() << "accepted --communication-aware-checkpointing with LoRA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--communication-aware-checkpointing"), std::string::npos) << e.what();
  }
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
