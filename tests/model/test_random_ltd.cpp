// random-LTD inside the model (model/gpt.hpp: set_random_ltd_layers, set_kept_tokens).
//
// - The kept positions: `kept` distinct sorted positions per sample and layer, a function of the
//   global sample (seed, first_sample + b, layer), not of the micro-batch it falls in.
// - Kept rows: a one-layer model dropping tokens in its layer gives, on the kept rows, exactly the
//   plain model run on the kept tokens as a shorter sequence (position embeddings zeroed so that the
//   two see the same inputs; targets only on kept rows): loss and every gradient (but the position
//   table's, which lands on other rows) within 1e-5
//   relative (the attention's softmax and the GEMMs see other shapes, so the fp32 sums round
//   differently; seen ~1e-7).
// - Dropped rows pass the layer unchanged: with targets only on dropped rows the loss equals,
//   bitwise, that of the same model whose layer adds nothing (output projections zeroed).
// - Nothing dropped (kept >= T, or no layers) is the plain model bitwise; evaluation never drops.
// - The whole model's backward with a dropping middle layer (dense, and MoE with RTS and dropped
//   routes) against finite differences of the same training forward, fp32, eps = 1e-2, tolerance
//   5e-3 + 3e-2 |fd| (test_moe's, for the same reasons); recomputation and CAC give the same
//   gradients bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/model/gpt.hpp"

using namespace hpct;

namespace {
model::GptConfig tiny(int layers, bool moe = false) {
  model::GptConfig c;
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_heads = 2;
  c.max_seq_length = 8;
  c.vocab_size = 23;
  c.vocab_multiple = 8;
  c.init_std = 0.2;
  if (moe) {
    c.moe.num_experts = {4};
    c.moe.expert_interval = 2;  // layer index 1 is MoE
    c.moe.train_capacity_factor = c.moe.eval_capacity_factor = 0.75;
    c.moe.min_capacity = 1;
    c.moe.second_expert_sampling = false;
    c.moe.loss_coeff = 0.1;
  }
  return c;
}

struct Batch {
  int B = 2, T = 8;
  std::vector<int32_t> tok, tgt;
  Batch() : tok(B * T), tgt(B * T) {
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % 23, tgt[i] = (i * 5 + 1) % 23;
  }
};

// Training forward's total loss (token losses + the MoE terms forward_backward differentiates).
double train_loss(model::Gpt& m, const std::vector<float>& p, const Batch& d) {
  std::vector<float> scratch(p.size(), 0.0f);
  model::FlatParamStore st(m.layout(), const_cast<float*>(p.data()), scratch.data());
  m.reset_moe_stats();
  double l = m.forward_backward(st, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
  for (const auto& s : m.moe_stats()) l += double(d.B) * d.T * m.config().moe.loss_coeff * s.aux_loss;
  return l;
}

// Layer 0's kept positions of the last training step, as two batches: `masked` (d with targets
// on the kept rows only) and `sub` (the kept tokens alone, a sequence of k per sample).
void split_kept(const model::Gpt& ltd, const Batch& d, int k, Batch& masked, Batch& sub) {
  masked = d;
  sub.T = k;
  sub.tok.assign(d.B * k, 0), sub.tgt.assign(d.B * k, 0);
  std::fill(masked.tgt.begin(), masked.tgt.end(), -1);
  for (int b = 0; b < d.B; ++b) {
    const std::vector<int> pos = ltd.kept_positions(0, b);
    ASSERT_EQ((int)pos.size(), k);
    for (int j = 0; j < k; ++j) {
      masked.tgt[b * d.T + pos[j]] = d.tgt[b * d.T + pos[j]];
      sub.tok[b * k + j] = d.tok[b * d.T + pos[j]];
      sub.tgt[b * k + j] = d.tgt[b * d.T + pos[j]];
    }
  }
}

std::vector<float> grads_of(model::Gpt& m, std::vector<float>& p, const Batch& d, double* loss = nullptr) {
  std::vector<float> g(p.size(), 0.0f);
  model::FlatParamStore st(m.layout(), p.data(), g.data());
  const double l = m.forward_backward(st, d.tok.data(), d.tgt.data(), d.B, d.T, 1.0f);
  if (loss) *loss = l;
  return g;
}
}  // namespace

TEST(RandomLtd, KeptPositionsAreSortedSubsetsOfTheGlobalSample) {
  model::Gpt m(tiny(3), kernels::Precision::fp32, false);
  m.set_random_ltd_layers({1, 2});
  std::vector<float> p(m.layout().numel());
  m.init_params(p.data(), 1);
  Batch d;
  m.set_kept_tokens(5, 77, 10);
  train_loss(m, p, d);
  std::vector<std::vector<int>> seen;
  for (int l : {1, 2})
    for (int b = 0; b < d.B; ++b) {
      const std::vector<int> k = m.kept_positions(l, b);
      ASSERT_EQ(k.size(), 5u);
      EXPECT_TRUE(std::is_sorted(k.begin(), k.end()));
      EXPECT_EQ(std::set<int>(k.begin(), k.end()).size(), 5u);
      EXPECT_GE(k.front(), 0);
      EXPECT_LT(k.back(), d.T);
      seen.push_back(k);
    }
  EXPECT_TRUE(m.kept_positions(0, 0).empty()) << "layer 0 drops nothing";
  EXPECT_NE(seen[0], seen[2]) << "layers draw independently";
  EXPECT_NE(seen[0], seen[1]) << "samples draw independently";
  // Sample 11 alone in a micro-batch of one keeps what it kept as the second sample of 10..11.
  Batch one;
  one.B = 1;
  one.tok.resize(8), one.tgt.resize(8);
  std::copy_n(d.tok.begin() + 8, 8, one.tok.begin());
  std::copy_n(d.tgt.begin() + 8, 8, one.tgt.begin());
  m.set_kept_tokens(5, 77, 11);
  train_loss(m, p, one);
  EXPECT_EQ(m.kept_positions(1, 0), seen[1]);
  EXPECT_EQ(m.kept_positions(2, 0), seen[3]);
}

TEST(RandomLtd, KeptRowsEqualThePlainLayerOnTheSubset) {
  const Batch d;
  model::GptConfig c = tiny(1);
  model::Gpt ltd(c, kernels::Precision::fp32, false), plain(c, kernels::Precision::fp32, false);
  ltd.set_random_ltd_layers({0});
  std::vector<float> p(ltd.layout().numel());
  ltd.init_params(p.data(), 5);
  const TensorSpec& wpe = ltd.layout().find("embedding.position_embeddings.weight");
  std::fill_n(p.begin() + wpe.offset, wpe.numel, 0.0f);  // positions would differ in the compacted run
  const int k = 5;
  ltd.set_kept_tokens(k, 3, 0);
  train_loss(ltd, p, d);  // draws the positions
  Batch masked, sub;
  split_kept(ltd, d, k, masked, sub);
  if (HasFatalFailure()) return;
  double l_ltd = 0, l_plain = 0;
  std::vector<float> pl = p, pp = p;
  const std::vector<float> g_ltd = grads_of(ltd, pl, masked, &l_ltd);
  const std::vector<float> g_plain = grads_of(plain, pp, sub, &l_plain);
  EXPECT_NEAR(l_ltd, l_plain, 1e-5 * std::fabs(l_plain));
  float gmax = 0;
  for (float v : g_plain) gmax = std::max(gmax, std::fabs(v));
  int bad = 0;
  for (size_t i = 0; i < g_plain.size(); ++i) {
    // The position table's gradient lands on the kept positions' rows in one run and on rows
    // 0..k-1 in the other: every other tensor must agree.
    if (i >= wpe.offset && i < wpe.offset + wpe.numel) continue;
    if (std::fabs(g_ltd[i] - g_plain[i]) > 1e-5f * gmax && bad++ < 5)
      ADD_FAILURE() << "gradient " << i << ": " << g_ltd[i] << " vs " << g_plain[i];
  }
  EXPECT_EQ(bad, 0);
}

TEST(RandomLtd, DroppedRowsPassTheLayerUnchanged) {
  const Batch d;
  model::GptConfig c = tiny(1);
  model::Gpt ltd(c, kernels::Precision::fp32, false), idle(c, kernels::Precision::fp32, false);
  ltd.set_random_ltd_layers({0});
  std::vector<float> p(ltd.layout().numel());
  ltd.init_params(p.data(), 9);
  ltd.set_kept_tokens(3, 4, 0);
  train_loss(ltd, p, d);
  Batch dropped = d;
  for (int b = 0; b < d.B; ++b)
    for (int t : ltd.kept_positions(0, b)) dropped.tgt[b * d.T + t] = -1;  // targets on dropped rows only
  // The same layer made to add nothing to the residual stream: zero output projections.
  std::vector<float> q = p;
  for (const auto& t : ltd.layout().tensors())
    if (t.name.find("dense_4h_to_h") != std::string::npos || t.name.find("attention.dense.") != std::string::npos)
      std::fill_n(q.begin() + t.offset, t.numel, 0.0f);
  double l_ltd = 0, l_idle = 0;
  grads_of(ltd, p, dropped, &l_ltd);
  grads_of(idle, q, dropped, &l_idle);
  EXPECT_EQ(l_ltd, l_idle);
  // The check bites: with the layer working, the dropped rows' loss would differ.
  double l_work = 0;
  std::vector<float> p2 = p;
  grads_of(idle, p2, dropped, &l_work);
  EXPECT_NE(l_work, l_idle);
}

TEST(RandomLtd, NothingDroppedIsThePlainModelBitwise) {
  const Batch d;
  model::Gpt plain(tiny(3, true), kernels::Precision::fp32, false);
  std::vector<float> p(plain.layout().numel());
  plain.init_params(p.data(), 2);
  plain.set_routing_seed(8);
  double l0 = 0;
  std::vector<float> p0 = p;
  const auto g0 = grads_of(plain, p0, d, &l0);
  for (int kept : {0, 8, 12}) {
    model::Gpt m(tiny(3, true), kernels::Precision::fp32, false);
    m.set_random_ltd_layers({1});
    m.set_routing_seed(8);
    m.set_kept_tokens(kept, 1, 0);
    double l = 0;
    std::vector<float> q = p;
    EXPECT_EQ(grads_of(m, q, d, &l), g0) << "kept " << kept;
    EXPECT_EQ(l, l0) << "kept " << kept;
  }
  // Evaluation sees every token whatever the kept count.
  model::Gpt m(tiny(3, true), kernels::Precision::fp32, false);
  m.set_random_ltd_layers({1});
  m.set_routing_seed(8);
  m.set_kept_tokens(3, 1, 0);
  std::vector<float> g(p.size());
  model::FlatParamStore a(plain.layout(), p.data(), g.data()), b(m.layout(), p.data(), g.data());
  EXPECT_EQ(m.forward_loss(b, d.tok.data(), d.tgt.data(), d.B, d.T), plain.forward_loss(a, d.tok.data(), d.tgt.data(), d.B, d.T));
}

// dense, MoE, or rotary positions with documents (per-document attention and positions: token 17
// ends sample 0's first document at position 2)
enum class Kind { dense, moe, rotary_documents };
class RandomLtdBackward : public ::testing::TestWithParam<Kind> {};

TEST_P(RandomLtdBackward, MatchesFiniteDifferences) {
  const bool moe = GetParam() == Kind::moe;
  const Batch d;
  model::GptConfig c = tiny(3, moe);
  if (GetParam() == Kind::rotary_documents) {
    c.rotary = true;
    c.eod_token = 17;
    c.reset_attention_mask = c.reset_position_ids = true;
  }
  model::Gpt m(c, kernels::Precision::fp32, false);
  m.set_random_ltd_layers({1});
  m.set_routing_seed(99);
  m.set_kept_tokens(5, 21, 0);
  std::vector<float> p(m.layout().numel());
  m.init_params(p.data(), 42);
  const std::vector<float> g = grads_of(m, p, d);
  if (moe) EXPECT_GT(m.moe_stats()[0].dropped, 0) << "capacity factor 0.75 must drop routes";
  int checked = 0, bad = 0, flips = 0;
  std::vector<long long> hash0;
  auto probe = [&](std::vector<long long>* h) {
    const double l = train_loss(m, p, d);
    h->clear();
    for (const auto& s : m.moe_stats()) h->push_back((long long)s.routing_hash);
    return l;
  };
  probe(&hash0);
  for (const auto& t : m.layout().tensors()) {
    if (t.name.find("layers.1.") != 0 && t.name.find("layers.0.") != 0 && t.name.find("embedding.word") != 0) continue;
    const size_t step = std::max<size_t>(1, t.numel / 4);
    for (size_t k = 0; k < t.numel; k += step) {
      if (t.name.find("word_embeddings") != std::string::npos && k / 16 >= 23) continue;  // padding rows
      const size_t i = t.offset + k;
      const float keep = p[i], eps = 1e-2f;
      std::vector<long long> h1, h2;
      p[i] = keep + eps;
      const double lp = probe(&h1);
      p[i] = keep - eps;
      const double lm = probe(&h2);
      p[i] = keep;
      if (h1 != hash0 || h2 != hash0) {  // a route flipped inside the probe
        ++flips;
        continue;
      }
      const double fd = (lp - lm) / (2 * eps);
      ++checked;
      if (std::fabs(fd - g[i]) > 5e-3 + 3e-2 * std::fabs(fd))
        if (bad++ < 8) ADD_FAILURE() << t.name << "[" << k << "] analytic " << g[i] << " fd " << fd;
    }
  }
  EXPECT_GT(checked, 40);
  EXPECT_LE(flips, checked / 10);
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Layers, RandomLtdBackward, ::testing::Values(Kind::dense, Kind::moe, Kind::rotary_documents),
                         [](const auto& info) {
                           return std::string(info.param == Kind::dense ? "dense" : info.param == Kind::moe ? "moe" : "rotary_documents");
                         });

// With rotary positions a kept row keeps its own position. Rotary attention depends on positions
// only through their differences, so where every sample keeps one contiguous run of positions the
// layer equals the plain model on the kept tokens as a shorter sequence (whose positions start at 0),
// within the same 1e-5 as above (cos/sin of other angles round differently); where a sample's kept
// positions have a gap, the plain model on the compacted tokens is another function (the check
// bites: positions are not renumbered).
TEST(RandomLtd, RotaryKeptRowsKeepTheirPositions) {
  const Batch d;
  model::GptConfig c = tiny(1);
  c.rotary = true;
  const int k = 7;
  auto run = [&](uint64_t seed, bool* contiguous) {
    model::Gpt ltd(c, kernels::Precision::fp32, false), plain(c, kernels::Precision::fp32, false);
    ltd.set_random_ltd_layers({0});
    std::vector<float> p(ltd.layout().numel());
    ltd.init_params(p.data(), 5);
    ltd.set_kept_tokens(k, seed, 0);
    train_loss(ltd, p, d);
    Batch masked, sub;
    split_kept(ltd, d, k, masked, sub);
    *contiguous = true;
    for (int b = 0; b < d.B; ++b) {
      const std::vector<int> pos = ltd.kept_positions(0, b);
      *contiguous = *contiguous && pos.size() == size_t(k) && pos.back() - pos.front() == k - 1;
    }
    double l_ltd = 0, l_plain = 0;
    std::vector<float> pl = p, pp = p;
    grads_of(ltd, pl, masked, &l_ltd);
    grads_of(plain, pp, sub, &l_plain);
    return std::pair{l_ltd, l_plain};
  };
  int runs = 0, gaps = 0;
  for (uint64_t seed = 1; seed < 400 && (runs < 2 || gaps < 2); ++seed) {
    bool contiguous = false;
    const auto [l_ltd, l_plain] = run(seed, &contiguous);
    if (contiguous && runs < 2) {
      ++runs;
      EXPECT_NEAR(l_ltd, l_plain, 1e-5 * std::fabs(l_plain)) << "seed " << seed;
    } else if (!contiguous && gaps < 2) {
      ++gaps;
      EXPECT_GT(std::fabs(l_ltd - l_plain), 1e-4 * std::fabs(l_plain)) << "seed " << seed;
    }
  }
  EXPECT_EQ(runs, 2) << "no seed kept contiguous runs in both samples";
  EXPECT_EQ(gaps, 2);
}

TEST(RandomLtd, RecomputeAndCacGiveTheSameGradients) {
  const Batch d;
  for (bool moe : {false, true}) {
    std::vector<float> g[3];
    for (int r = 0; r < 3; ++r) {
      model::Gpt m(tiny(3, moe), kernels::Precision::fp32, r >= 1);
      m.set_communication_aware_checkpointing(r == 2);
      m.set_random_ltd_layers({1});
      m.set_routing_seed(5);
      m.set_kept_tokens(4, 6, 0);
      std::vector<float> p(m.layout().numel());
      m.init_params(p.data(), 3);
      g[r] = grads_of(m, p, d);
    }
    EXPECT_EQ(g[0], g[1]) << (moe ? "moe " : "dense ") << "recompute";
    EXPECT_EQ(g[0], g[2]) << (moe ? "moe " : "dense ") << "recompute with CAC";
  }
}

TEST(RandomLtd, BadLayersAreNamed) {
  model::Gpt m(tiny(3), kernels::Precision::fp32, false);
  try {
    m.set_random_ltd_layers({1, 3});
    FAIL() << "layer 3 of a 3-layer model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("random_ltd_layer_id"), std::string::npos) << e.what();
  }
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
