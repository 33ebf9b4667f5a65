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
// - generation (model/generation.hpp): a copied decoder slot continues exactly as its original
//   (bitwise: the same rows in the same GEMM shapes); samples do not depend on the batching (the
//   same batch shapes are not guaranteed, so within the greedy choice: equal ids); a stop check ends
//   a sample at the token it names; the repetition penalty divides positive and multiplies negative
//   logits once per distinct id; beam search of width 1 is greedy, and a beam wide enough to keep
//   every prefix finds the exhaustive best sum of log-probabilities of a 6-id vocabulary at 3 new
//   tokens (within 1e-6 relative: cached steps against full passes, whose GEMMs differ in
//   shape), its hypotheses best first with
//   score = sum / length^length_penalty.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/model/decoder.hpp"
#include "hpct/model/generation.hpp"
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

// The radix order sample_token draws in is the comparison order on (logit desc, id asc): random
// rows of a GPT-2-sized vocabulary with many ties (logits on a coarse grid), both zeros, infinities,
// denormals and odd lengths below and above one radix digit's 2048 buckets.
TEST(Sampling, MostLikelyFirstIsTheComparisonOrder) {
  std::mt19937_64 rng(11);
  for (int V : {1, 2, 7, 2047, 2049, 50257}) {
    for (int row = 0; row < 3; ++row) {
      std::vector<float> l(V);
      for (int i = 0; i < V; ++i) {
        const uint64_t r = rng();
        l[i] = row == 0 ? float(int(r % 64) - 32) * 0.25f : std::ldexp(float(int64_t(r >> 40) - (1 << 23)), -int(r % 140));
      }
      if (V > 6) {
        l[1] = 0.0f, l[2] = -0.0f, l[3] = INFINITY, l[4] = -INFINITY, l[5] = 1e-42f, l[6] = -1e-42f;
      }
      std::vector<int32_t> want(V);
      std::iota(want.begin(), want.end(), 0);
      std::sort(want.begin(), want.end(),
                [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
      EXPECT_EQ(model::most_likely_first(l.data(), V), want) << "V " << V << " row " << row;
    }
  }
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

TEST(Generation, CopiedSlotContinuesAsItsOriginal) {
  const GptConfig c = tiny();
  std::vector<float> p = params_of(c, 21);
  const int Vp = c.padded_vocab();
  const auto ctx = tokens(9, 4, c.vocab_size);
  Decoder d(c, p.data(), 3);
  std::vector<float> a(Vp), b(Vp), l2(2 * (size_t)Vp);
  d.extend(2, ctx.data(), 9, a.data());
  d.extend(0, ctx.data(), 4, nullptr);  // something else there first: copy must replace it
  d.copy(2, 0);
  EXPECT_EQ(d.length(0), 9);
  const int32_t next[2] = {5, 5};
  const int both[2] = {0, 2};
  d.step(both, next, 2, l2.data());
  for (int v = 0; v < Vp; ++v) ASSERT_EQ(l2[v], l2[(size_t)Vp + v]) << "id " << v;
}

TEST(Generation, SamplesDoNotDependOnBatchingAndStopWhereAsked) {
  const GptConfig c = tiny();
  std::vector<float> p = params_of(c, 23);
  model::GenerationConfig g;
  g.max_new = 12;
  g.sampling.temperature = 0.8;
  g.eod = 7;
  std::vector<model::Sample> one, three;
  for (int i = 0; i < 5; ++i) {
    model::Sample s;
    s.prompt = tokens(3 + i, 30 + i, c.vocab_size);
    s.stream = i;
    one.push_back(s);
  }
  three = one;
  model::Generator(c, p.data(), c.vocab_size, 1).sample(one, g);
  model::Generator(c, p.data(), c.vocab_size, 3).sample(three, g);
  int tokens_made = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(one[i].ids, three[i].ids) << "sample " << i;
    EXPECT_EQ(one[i].ids.size(), one[i].logprobs.size());
    tokens_made += (int)one[i].ids.size();
    if (!one[i].ids.empty() && one[i].ids.back() == 7) {
      EXPECT_EQ(one[i].stop, "eod");
    }
  }
  EXPECT_GT(tokens_made, 20);
  // A stop check naming the second token of sample 0 ends it there.
  const int32_t second = one[0].ids.size() > 1 ? one[0].ids[1] : -1;
  ASSERT_GE(second, 0);
  std::vector<model::Sample> again{one[0]};
  model::Generator(c, p.data(), c.vocab_size, 1).sample(again, g, [&](const model::Sample& s) { return s.ids.back() == second; });
  const size_t at = std::find(one[0].ids.begin(), one[0].ids.end(), second) - one[0].ids.begin();
  EXPECT_EQ(again[0].ids, std::vector<int32_t>(one[0].ids.begin(), one[0].ids.begin() + at + 1));
  EXPECT_EQ(again[0].stop, "stop_sequence");
}

TEST(Generation, RepetitionPenaltyOncePerDistinctId) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 4.0f, 9.0f};  // id 4: beyond V = 4
  const int32_t seen[] = {0, 1, 0, 0, 4, 9};
  model::apply_repetition_penalty(l.data(), 4, seen, 6, 2.0);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 1.0f, 4.0f, 9.0f}));
}

namespace {
// Tiny with 6 real ids: every 3-token continuation can be scored.
GptConfig six_ids() {
  GptConfig c = tiny();
  c.vocab_size = 6;
  c.vocab_multiple = 8;
  return c;
}
double log_softmax_at(const float* l, int V, int id) {
  const float m = *std::max_element(l, l + V);
  double z = 0;
  for (int v = 0; v < V; ++v) z += std::exp(double(l[v]) - m);
  return double(l[id]) - (std::log(z) + m);
}
}  // namespace

TEST(Generation, BeamSearchIsGreedyAtWidthOneAndExhaustiveWhenWide) {
  const GptConfig c = six_ids();
  std::vector<float> p = params_of(c, 29);
  const int V = c.vocab_size, Vp = c.padded_vocab();
  const std::vector<int32_t> prompt = {1, 4, 2};
  model::GenerationConfig g;
  g.max_new = 3;
  g.sampling.temperature = 0;
  std::vector<model::Sample> greedy{{prompt, {}, {}, {}, 0, 0}};
  model::Generator(c, p.data(), V, 2).sample(greedy, g);
  g.beam_width = 1;
  auto w1 = model::Generator(c, p.data(), V, 2).beam_search(prompt, g);
  ASSERT_EQ(w1.size(), 1u);
  EXPECT_EQ(w1[0].ids, greedy[0].ids);
  // Every continuation of 3 ids, scored by full passes.
  Decoder d(c, p.data(), 1);
  std::vector<float> rows(6 * (size_t)Vp);
  double best = -1e300;
  std::vector<int32_t> best_ids;
  for (int a = 0; a < V; ++a)
    for (int b = 0; b < V; ++b)
      for (int e = 0; e < V; ++e) {
        std::vector<int32_t> t = prompt;
        t.insert(t.end(), {a, b, e});
        d.clear(0);
        d.extend(0, t.data(), (int)t.size(), rows.data(), true);
        double sum = 0;
        for (int k = 0; k < 3; ++k) sum += log_softmax_at(rows.data() + (size_t)(prompt.size() - 1 + k) * Vp, V, t[prompt.size() + k]);
        if (sum > best) best = sum, best_ids = {a, b, e};
      }
  g.beam_width = 36;  // >= V^2: every 2-token prefix kept
  g.length_penalty = 0;
  auto wide = model::Generator(c, p.data(), V, 72).beam_search(prompt, g);
  ASSERT_EQ(wide.size(), 36u);
  EXPECT_EQ(wide[0].ids, best_ids);
  EXPECT_NEAR(wide[0].score, best, 1e-6 * std::fabs(best));
  for (size_t i = 1; i < wide.size(); ++i) EXPECT_GE(wide[i - 1].score, wide[i].score);
  g.beam_width = 3;
  g.length_penalty = 1;
  auto w3 = model::Generator(c, p.data(), V, 6).beam_search(prompt, g);
  ASSERT_FALSE(w3.empty());
  for (const auto& h : w3) {
    double sum = 0;
    for (double x : h.logprobs) sum += x;
    EXPECT_NEAR(h.score, sum / h.ids.size(), 1e-12);
  }
  double greedy_sum = 0;
  for (double x : greedy[0].logprobs) greedy_sum += x;
  EXPECT_GE(w3[0].score * 3 + 1e-9, greedy_sum) << "a beam of 3 keeps the greedy path, so it cannot end below it";
}
