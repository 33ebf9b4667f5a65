// The generation path (model/decoder.hpp, model/sampling.hpp):
// - the decoder's logits for a whole sequence give Gpt::forward_loss's loss (the training model's
//   forward, so the two share every formula): within 1e-5 relative (fp32 both; the attention sums
//   in another order);
// - greedy decoding with the key/value cache chooses the same tokens as the argmax of a full
//   forward pass over the whole context at every step (no cache), and their logits agree within
//   1e-4 of the largest (the GEMMs see other row counts, so bits may differ);
// - the same two for MoE models (top-1, and top-2 Residual-MoE) that drop nothing, same tolerances;
// - several sequences stepped together equal each stepped alone (within 1e-5: batched GEMMs);
// - sampling: temperature 0 and top-k 1 are the argmax; frequencies follow the softmax (20000
//   draws, within 0.015: about 4 standard deviations); top-k and top-p cut what they should; the
//   padding columns are never drawn; the same seed gives the same draws; the log-probability is the
//   model's; bad settings name their flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/model/decoder.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/model/sampling.hpp"

using namespace hpct;
using model::Decoder;
using model::GptConfig;

namespace {

GptConfig tiny() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_heads = 4;
  c.max_seq_length = 48;
  c.vocab_size = 90;
  c.vocab_multiple = 64;  // Vp = 128: padding columns exist
  c.init_std = 0.3;       // spread logits: greedy choices are not near ties
  return c;
}

std::vector<float> params_of(const GptConfig& c, uint64_t seed) {
  model::Gpt g(c, kernels::Precision::fp32, false);
  std::vector<float> p(g.layout().numel());
  g.init_params(p.data(), seed);
  return p;
}

std::vector<int32_t> tokens(int n, uint64_t seed, int V) {
  std::mt19937 g(static_cast<unsigned>(seed));
  std::uniform_int_distribution<int> d(0, V - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(g);
  return t;
}

int argmax(const float* x, int V) { return static_cast<int>(std::max_element(x, x + V) - x); }

// The tiny model with MoE on its second layer: 4 experts, top-1, or top-2 Residual-MoE; nothing
// dropped (the training model's forward then equals the decoder's, which keeps every route).
GptConfig tiny_moe(int topk, bool residual) {
  GptConfig c = tiny();
  c.moe.num_experts = {4};
  c.moe.expert_interval = 2;
  c.moe.topk = topk;
  c.moe.residual = residual;
  c.moe.drop_tokens = false;
  return c;
}


void whole_sequence_loss(const GptConfig& c) {
  std::vector<float> p = params_of(c, 5);
  const int T = 40, Vp = c.padded_vocab();
  const auto tok = tokens(T + 1, 7, c.vocab_size);
  model::Gpt g(c, kernels::Precision::fp32, false);
  std::vector<float> grads(p.size());
  model::FlatParamStore store(g.layout(), p.data(), grads.data());
  const double want = g.forward_loss(store, tok.data(), tok.data() + 1, 1, T);

  Decoder d(c, p.data(), 1);
  std::vector<float> logits((size_t)T * Vp);
  d.extend(0, tok.data(), T, logits.data(), /*all_rows=*/true);
  double got = 0;
  for (int t = 0; t < T; ++t) {
    const float* l = logits.data() + (size_t)t * Vp;
    const float mx = *std::max_element(l, l + c.vocab_size);
    double z = 0;
    for (int v = 0; v < c.vocab_size; ++v) z += std::exp(double(l[v]) - mx);
    got += std::log(z) + mx - l[tok[t + 1]];
  }
  EXPECT_NEAR(got, want, 1e-5 * std::fabs(want));
  EXPECT_EQ(d.length(0), T);
}

void cached_greedy(const GptConfig& c) {
  std::vector<float> p = params_of(c, 11);
  const int Vp = c.padded_vocab(), V = c.vocab_size;
  std::vector<int32_t> ctx = tokens(6, 3, V);
  Decoder cached(c, p.data(), 1), full(c, p.data(), 1);
  std::vector<float> lc(Vp), lf(Vp);
  cached.extend(0, ctx.data(), (int)ctx.size(), lc.data());
  int distinct = 0;
  for (int step = 0; step < 30; ++step) {
    full.clear(0);
    full.extend(0, ctx.data(), (int)ctx.size(), lf.data());  // no cache: every position again
    const float scale = std::fabs(*std::max_element(lf.begin(), lf.begin() + V));
    for (int v = 0; v < V; ++v) ASSERT_NEAR(lc[v], lf[v], 1e-4 * scale) << "step " << step << ", id " << v;
    const int32_t next = argmax(lc.data(), V);
    ASSERT_EQ(next, argmax(lf.data(), V)) << "step " << step;
    distinct += std::count(ctx.begin(), ctx.end(), next) == 0;
    ctx.push_back(next);
    cached.step(std::vector<int>{0}.data(), &next, 1, lc.data());
  }
  EXPECT_EQ(cached.length(0), (int)ctx.size());
  EXPECT_GT(distinct, 1) << "greedy text that repeats one token checks little";
}

}  // namespace

TEST(Decoder, WholeSequenceLossIsTheTrainingModels) { whole_sequence_loss(tiny()); }
TEST(Decoder, CachedGreedyIsTheArgmaxOfFullPasses) { cached_greedy(tiny()); }
// MoE: the same checks and tolerances (the router's logits are one more fp32 GEMM; a route flip
// would be a near-tie, which these weights do not have).
TEST(Decoder, MoeWholeSequenceLossIsTheTrainingModels) {
  whole_sequence_loss(tiny_moe(1, false));
  whole_sequence_loss(tiny_moe(2, true));
}
TEST(Decoder, MoeCachedGreedyIsTheArgmaxOfFullPasses) {
  cached_greedy(tiny_moe(1, false));
  cached_greedy(tiny_moe(2, true));
}

void batched_steps(const GptConfig& c) {
  std::vector<float> p = params_of(c, 13);
  const int Vp = c.padded_vocab();
  const auto a = tokens(5, 1, c.vocab_size), b = tokens(9, 2, c.vocab_size);
  Decoder both(c, p.data(), 2), one(c, p.data(), 2);
  both.extend(0, a.data(), 5, nullptr);
  both.extend(1, b.data(), 9, nullptr);
  one.extend(0, a.data(), 5, nullptr);
  one.extend(1, b.data(), 9, nullptr);
  const int seqs[2] = {1, 0};
  for (int step = 0; step < 5; ++step) {
    const int32_t next[2] = {int32_t(step * 7 % 90), int32_t(step * 13 % 90)};
    std::vector<float> lb(2 * (size_t)Vp), l1(Vp), l0(Vp);
    both.step(seqs, next, 2, lb.data());
    one.step(&seqs[0], &next[0], 1, l1.data());
    one.step(&seqs[1], &next[1], 1, l0.data());
    for (int v = 0; v < c.vocab_size; ++v) {
      ASSERT_NEAR(lb[v], l1[v], 1e-5 * (1 + std::fabs(l1[v]))) << "step " << step;
      ASSERT_NEAR(lb[Vp + v], l0[v], 1e-5 * (1 + std::fabs(l0[v]))) << "step " << step;
    }
  }
}

TEST(Decoder, BatchedStepsEqualSeparateOnes) { batched_steps(tiny()); }
// The model options read through the same components: RMSNorm, an MLP 40 wide, SwiGLU (also in
// the experts of a residual MoE).
TEST(Decoder, RmsNormAndMlpWidthAreTheTrainingModels) {
  GptConfig c = tiny();
  c.normalization = model::NormKind::rmsnorm;
  c.ffn_hidden_size = 40;
  whole_sequence_loss(c);
  cached_greedy(c);
  c.mlp = model::MlpKind::swiglu;
  c.linear_bias = false;
  c.untie_embeddings = true;
  c.rotary = true;  // the cache holds rotated keys, each new query rotated at its own position
  c.num_kv_heads = 1;  // and the key/value heads only
  c.rope_theta = 100;
  whole_sequence_loss(c);
  cached_greedy(c);
  batched_steps(c);
  GptConfig m = tiny_moe(2, true);
  m.mlp = model::MlpKind::swiglu;
  m.ffn_hidden_size = 24;
  whole_sequence_loss(m);
  batched_steps(m);
}
// MoE: a token's routes do not depend on the other sequences of the step (nothing is dropped).
TEST(Decoder, MoeBatchedStepsEqualSeparateOnes) { batched_steps(tiny_moe(2, true)); }

TEST(Decoder, RefusesWhatItCannotRun) {
  GptConfig c = tiny();
  std::vector<float> p = params_of(c, 1);
  Decoder d(c, p.data(), 1);
  std::vector<int32_t> t(c.max_seq_length + 1, 1);
  EXPECT_THROW(d.extend(0, t.data(), (int)t.size(), nullptr), hpct::Error);
  t[0] = c.vocab_size;  // beyond the vocabulary
  EXPECT_THROW(d.extend(0, t.data(), 1, nullptr), hpct::Error);
  c.tensor_parallel = 2;
  try {
    Decoder m(c, p.data(), 1);
    ADD_FAILURE() << "a tensor-parallel config was accepted";
  } catch (const hpct::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size"), std::string::npos) << e.what();
  }
}

TEST(Sampling, FollowsTheSoftmaxAndItsCuts) {
  // 3 real ids with probabilities 0.5, 0.3, 0.2, then padding columns larger than any.
  std::vector<float> l = {std::log(0.3f), std::log(0.5f), std::log(0.2f), 50.0f, 60.0f};
  const int V = 3, n = 20000;
  auto freq = [&](const model::SamplingConfig& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<double> f(V, 0.0);
    for (int i = 0; i < n; ++i) {
      const int id = model::sample_token(l.data(), V, c, rng, nullptr);
      EXPECT_LT(id, V) << "a padding column was drawn";
      f[std::min(id, V - 1)] += 1.0 / n;
    }
    return f;
  };
  model::SamplingConfig c;
  auto f = freq(c, 1);
  EXPECT_NEAR(f[0], 0.3, 0.015);
  EXPECT_NEAR(f[1], 0.5, 0.015);
  EXPECT_NEAR(f[2], 0.2, 0.015);
  EXPECT_EQ(f, freq(c, 1)) << "the same seed must give the same draws";
  EXPECT_NE(f, freq(c, 2));
  c.top_k = 2;  // ids 1 and 0: 0.5/0.8 and 0.3/0.8
  f = freq(c, 3);
  EXPECT_NEAR(f[1], 0.625, 0.015);
  EXPECT_EQ(f[2], 0.0);
  c.top_k = 0, c.top_p = 0.6;  // 0.5 < 0.6, then 0.8: the same two
  f = freq(c, 4);
  EXPECT_NEAR(f[1], 0.625, 0.015);
  EXPECT_EQ(f[2], 0.0);
  c.top_p = 0.4;  // the most likely alone
  EXPECT_NEAR(freq(c, 5)[1], 1.0, 1e-9);
  c = {};
  c.temperature = 0;
  std::mt19937_64 rng(9);
  double lp = 0;
  EXPECT_EQ(model::sample_token(l.data(), V, c, rng, &lp), 1);
  EXPECT_NEAR(lp, std::log(0.5), 1e-6);
  c = {};
  c.top_k = 1;
  EXPECT_NEAR(freq(c, 6)[1], 1.0, 1e-9);
  c = {};
  c.temperature = 0.5;  // sharper: p ~ softmax(2 l) = 0.25, 0.69, 0.11 (0.09/0.25/0.04 over 0.38)
  f = freq(c, 7);
  EXPECT_NEAR(f[1], 0.25 / 0.38, 0.015);
}

TEST(Sampling, BadSettingsNameTheirFlag) {
  auto flag_of = [](model::SamplingConfig c) {
    try {
      c.validate();
    } catch (const hpct::Error& e) {
      return e.context().key;
    }
    return std::string("accepted");
  };
  model::SamplingConfig c;
  c.temperature = -1;
  EXPECT_EQ(flag_of(c), "--temperature");
  c = {};
  c.top_k = -2;
  EXPECT_EQ(flag_of(c), "--top-k");
  c = {};
  c.top_p = 0;
  EXPECT_EQ(flag_of(c), "--top-p");
  c.top_p = 1.5;
  EXPECT_EQ(flag_of(c), "--top-p");
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
