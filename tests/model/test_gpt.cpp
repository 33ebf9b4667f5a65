// The whole model's backward against finite differences of its forward loss, for parameters in
// every block (embeddings, each layer, final norm), with and without activation recompute; and
// recompute must not change a single bit of the gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/half.hpp"
#include "hpct/model/gpt.hpp"
#include "gpt_test_models.hpp"
#include "staged_cpu_ops.hpp"

using namespace hpct;
using test::fixed_batch, test::kB, test::kT, test::llama_like, test::tiny, test::with_dropout, test::HalfCopyStore;

namespace {

// With dropout the loss of a training step is the function whose gradient backward computes (the
// masks are fixed by the seed and the samples), so the differences are taken of forward_backward's
// loss into a scratch gradient store; evaluation (forward_loss) does not drop.
void check_finite_differences(const model::GptConfig& cfg, bool dropout) {
  const int B = 2, T = 6;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = (i * 7 + 3) % 23;
    tgt[i] = (i * 5 + 1) % 23;
  }
  tgt[4] = -1;  // an ignored position
  for (bool recompute : {false, true}) {
    model::Gpt m(cfg, kernels::Precision::fp32, recompute);
    m.set_dropout_seed(1234, 50);
    std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f), dummy(p.size());
    m.init_params(p.data(), 42);
    model::FlatParamStore st(m.layout(), p.data(), g.data());
    double loss = m.forward_backward(st, tok.data(), tgt.data(), B, T, 1.0f);
    model::FlatParamStore fst(m.layout(), p.data(), dummy.data());
    auto step_loss = [&] {
      return dropout ? m.forward_backward(fst, tok.data(), tgt.data(), B, T, 1.0f)
                     : m.forward_loss(fst, tok.data(), tgt.data(), B, T);
    };
    EXPECT_NEAR(loss, step_loss(), 1e-4);
    int checked = 0, bad = 0;
    for (const auto& t : m.layout().tensors()) {
      size_t step = std::max<size_t>(1, t.numel / 5);
      for (size_t k = 0; k < t.numel; k += step) {
        size_t i = t.offset + k;
        const bool vocab_rows = t.name.find("word_embeddings") != std::string::npos || t.name == "output_layer.weight";
        if (vocab_rows && k / 16 >= 23) continue;  // padding rows
        float keep = p[i];
        const float eps = 1e-2f;
        p[i] = keep + eps;
        double lp = step_loss();
        p[i] = keep - eps;
        double lm = step_loss();
        p[i] = keep;
        double fd = (lp - lm) / (2 * eps);
        ++checked;
        if (std::fabs(fd - g[i]) > 5e-3 + 3e-2 * std::fabs(fd)) {
          if (bad++ < 8) ADD_FAILURE() << t.name << "[" << k << "] analytic " << g[i] << " fd " << fd << " recompute " << recompute;
        }
      }
    }
    EXPECT_GT(checked, 80);  // 5 points of every tensor (the Llama-shaped model has fewer tensors)
    EXPECT_EQ(bad, 0);
  }
}

// Loss and gradients of one training step of cfg on the fixed batch (dropout seed 9, first sample
// first), on `be` (nullptr: the CPU backend).
std::pair<double, std::vector<float>> train_step(const model::GptConfig& cfg, bool recompute, long long first,
                                                 kernels::OpsBackend* be = nullptr) {
  const int B = kB, T = kT;
  const auto [tok, tgt] = fixed_batch();
  model::Gpt m(cfg, kernels::Precision::fp32, recompute, be);
  m.set_dropout_seed(9, first);
  std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
  m.init_params(p.data(), 7);
  model::FlatParamStore st(m.layout(), p.data(), g.data());
  const double loss = m.forward_backward(st, tok.data(), tgt.data(), B, T, 1.0f);
  return {loss, g};
}

}  // namespace

TEST(Gpt, BackwardMatchesFiniteDifferences) { check_finite_differences(tiny(), false); }

// Llama's options together: RMSNorm, SwiGLU MLPs 24 wide, no linear biases, an untied output layer,
// rotary positions (theta 100: 6 positions turn the pairs visibly), one key/value head.
TEST(Gpt, LlamaShapedBackwardMatchesFiniteDifferences) {
  model::GptConfig c = tiny();
  c.rotary = true;
  c.rope_theta = 100;
  c.num_kv_heads = 1;  // multi-query: both query heads share one key/value head
  c.normalization = model::NormKind::rmsnorm;
  c.mlp = model::MlpKind::swiglu;
  c.ffn_hidden_size = 24;
  c.linear_bias = false;
  c.untie_embeddings = true;
  check_finite_differences(c, false);
}

// Tolerances as above: the masks are constants of the step, so the same fp32 differences apply.
TEST(Gpt, BackwardWithDropoutMatchesFiniteDifferences) { check_finite_differences(with_dropout(0.2, 0.2), true); }

// Recompute replays the forward with the same masks (bitwise); the mask follows the samples'
// global index; p = 0 is the model without dropout bitwise; evaluation never drops.
TEST(Gpt, DropoutIsAFunctionOfTheSamples) {
  const auto c = with_dropout(0.1, 0.1);
  const auto plain = train_step(tiny(), false, 0);
  const auto a = train_step(c, false, 100), b = train_step(c, true, 100), other = train_step(c, false, 101);
  EXPECT_EQ(a.second, b.second) << "recompute changed the masks";
  EXPECT_EQ(a.first, b.first);
  EXPECT_NE(a.first, other.first) << "another first sample must draw other masks";
  EXPECT_NE(a.first, plain.first) << "nothing was dropped";
  const auto zero = train_step(with_dropout(0.0, 0.0), false, 100);
  EXPECT_EQ(zero.first, plain.first);
  EXPECT_EQ(zero.second, plain.second);
  // Each site alone drops something.
  EXPECT_NE(train_step(with_dropout(0.1, 0.0), false, 100).first, plain.first);
  EXPECT_NE(train_step(with_dropout(0.0, 0.1), false, 100).first, plain.first);
  // Evaluation: the dropout model's forward_loss equals the plain model's.
  const int B = 1, T = 6;
  std::vector<int32_t> tok = {1, 5, 9, 2, 7, 3}, tgt = {5, 9, 2, 7, 3, 4};
  double eval[2];
  for (int k = 0; k < 2; ++k) {
    model::Gpt m(k ? c : tiny(), kernels::Precision::fp32, false);
    m.set_dropout_seed(9, 0);
    std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
    m.init_params(p.data(), 7);
    model::FlatParamStore st(m.layout(), p.data(), g.data());
    eval[k] = m.forward_loss(st, tok.data(), tgt.data(), B, T);
  }
  EXPECT_EQ(eval[0], eval[1]);
}

TEST(Gpt, DropoutOutsideZeroToOneIsRefused) {
  for (double bad : {-0.1, 1.0, 1.5}) {
    EXPECT_THROW(model::Gpt(with_dropout(bad, 0), kernels::Precision::fp32, false), hpct::Error);
    EXPECT_THROW(model::Gpt(with_dropout(0, bad), kernels::Precision::fp32, false), hpct::Error);
  }
}

TEST(Gpt, RecomputeGivesIdenticalGradients) {
  const int B = kB, T = kT;
  const auto [tok, tgt] = fixed_batch();
  std::vector<float> grads[2];
  for (int r = 0; r < 2; ++r) {
    model::Gpt m(tiny(), kernels::Precision::fp32, r == 1);
    std::vector<float> p(m.layout().numel());
    grads[r].assign(p.size(), 0.0f);
    m.init_params(p.data(), 7);
    model::FlatParamStore st(m.layout(), p.data(), grads[r].data());
    m.forward_backward(st, tok.data(), tgt.data(), B, T, 1.0f);
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// The LM head's row block is the backend's (OpsBackend::head_rows: the CPU's 256, larger on a GPU):
// rows are independent in exact arithmetic, so a block changes only rounding: the GEMMs pick their
// kernels by row count (so a row's logits and d(input) round differently) and the head's weight
// gradient sums its blocks in another order. Checked with blocks of 5 rows (12 rows: 5, 5, 2)
// against one block, plain and with LoRA on the embedding (whose head-side buffers are sized by
// the block too). Bounds: the loss to 1e-6 relative; gradients to 1e-6 + 1e-4 relative, as
// measured here the differences reach 3.8e-5 relative on O(1e-2) gradients after the layers'
// backward carries them (5e-7 absolute at most), while a block that dropped or doubled rows moves
// the loss by a whole row's share (several percent).
TEST(Gpt, TheHeadsRowBlockChangesOnlyTheGradientsRounding) {
  model::GptConfig lora = tiny();
  lora.lora.rank = 4;
  lora.lora.targets = 0x1F;
  for (const model::GptConfig& cfg : {tiny(), lora}) {
    double loss[2];
    std::vector<float> grads[2];
    for (int k = 0; k < 2; ++k) {
      test::StagedCpuOps be;
      if (k == 1) be.set_head_rows(5);
      std::tie(loss[k], grads[k]) = train_step(cfg, false, 0, &be);
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-6 * std::fabs(loss[0]));
    size_t off = 0, differ = 0;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      const bool out = std::fabs(grads[1][i] - grads[0][i]) > 1e-6 + 1e-4 * std::fabs(grads[0][i]);
      if (out && off < 6) ADD_FAILURE() << i << ": " << grads[0][i] << " vs " << grads[1][i];
      off += out;
      differ += grads[1][i] != grads[0][i];
    }
    EXPECT_EQ(off, 0u) << (cfg.lora.rank ? "LoRA" : "plain") << ": gradients beyond the rounding bound";
    if (!cfg.lora.rank) EXPECT_GT(differ, 0u) << "the blocks changed no sum: the test would not see a block at all";
  }
}

// The pre-flight memory check plans the workspace before it is taken: workspace_bytes(B, T) is what
// reserve(B, T) then allocates (the backend's own scratch apart), on the CPU and on a device backend
// (with its per-row input buffers), with recompute, LoRA and per-document masks and positions.
TEST(Gpt, WorkspaceBytesAreWhatReserveTakes) {
  model::GptConfig lora = tiny(), docs = tiny();
  lora.lora.rank = 4;
  lora.lora.targets = 0x1F;
  docs.reset_attention_mask = docs.reset_position_ids = true;
  docs.eod_token = 0;
  for (const model::GptConfig& cfg : {tiny(), lora, docs})
    for (bool recompute : {false, true})
      for (bool device : {false, true}) {
        test::StagedCpuOps staged;
        model::Gpt m(cfg, kernels::Precision::fp32, recompute, device ? &staged : nullptr);
        const size_t want = m.workspace_bytes(2, 6), scratch = m.activation_bytes();
        m.reserve(2, 6);
        EXPECT_EQ(m.activation_bytes() - scratch, want)
            << (cfg.lora.rank ? "LoRA" : cfg.reset_attention_mask ? "documents" : "plain") << ", recompute " << recompute
            << ", device " << device;
        EXPECT_GT(want, size_t(4) * 2 * 6 * 16) << "at least the residual stream";
      }
}

// On a device backend the token losses come back beside the backward, not by draining the backend
// in the middle of the step: a dense step makes no blocking copy to the host, and its loss and
// gradients are the CPU's bitwise (the staged backend defers the download until the loss is asked for).
TEST(Gpt, TheLossIsReadBackBesideTheBackward) {
  test::StagedCpuOps staged;
  staged.defer_transfers(true);
  const auto cpu = train_step(tiny(), false, 0);
  const auto dev = train_step(tiny(), false, 0, &staged);
  EXPECT_EQ(dev.first, cpu.first);
  EXPECT_EQ(dev.second, cpu.second);
  EXPECT_EQ(staged.blocking_downloads(), 0);
  EXPECT_EQ(staged.transfers(), 1) << "one download of the token losses";
}

// The linears hand their weights' 16-bit copies to the GEMMs where the store keeps them
// (ParamStore::params16). A backend computing from the 16-bit form alone wherever one is given
// (the staged one with prefer_half, as a device's tensor-core path reads it) gives the loss and
// gradients of the fp32 values rounded inside the GEMMs, bitwise, in bf16, for GPT and for the
// Llama options (untied output layer, SwiGLU, no biases): so every 16-bit pointer the model passes
// is its tensor's. A copy off by one element must show (the test can fail).
TEST(Gpt, LinearsReadTheStoresHalfCopies) {
  const model::GptConfig llama = llama_like();
  const auto batch = fixed_batch();  // named, not bound: C++17 lambdas cannot capture structured bindings
  const std::vector<int32_t>&tok = batch.first, &tgt = batch.second;
  for (const model::GptConfig& cfg : {tiny(), llama}) {
    auto step = [&](int store_kind, bool prefer) {  // 0: no 16-bit copies; 1: right; 2: off by one
      test::StagedCpuOps be;
      be.prefer_half(prefer);
      model::Gpt m(cfg, kernels::Precision::bf16, false, &be);
      std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
      m.init_params(p.data(), 7);
      model::FlatParamStore flat(m.layout(), p.data(), g.data());
      HalfCopyStore half(m.layout(), p, g.data(), kernels::Precision::bf16, store_kind == 2 ? 1 : 0);
      model::ParamStore& st = store_kind ? static_cast<model::ParamStore&>(half) : flat;
      const double loss = m.forward_backward(st, tok.data(), tgt.data(), kB, kT, 1.0f);
      if (store_kind == 1) {
        EXPECT_GE(be.half_operands(), 5 * cfg.num_layers) << "qkv, proj, fc, fc2 and the head";
      }
      return std::make_pair(loss, g);
    };
    const auto want = step(0, false), got = step(1, true), off = step(2, true);
    const char* what = cfg.rotary ? "llama" : "gpt";
    EXPECT_EQ(got.first, want.first) << what;
    EXPECT_EQ(got.second, want.second) << what;
    EXPECT_NE(off.first, want.first) << what << ": a wrong 16-bit copy went unnoticed";
  }
}

TEST(Gpt, RejectsBadShapes) {
  auto c = tiny();
  c.num_heads = 3;
  EXPECT_THROW(model::Gpt(c, kernels::Precision::fp32, false), hpct::Error);
}

// Token ids past the table (or negative) are refused before the embedding reads or writes a row
// (issue 17, item 3: a .bin from another tokenizer crashed the CPU embedding with SIGSEGV).
TEST(Gpt, TokenOutsideTheVocabularyIsRefused) {
  const int B = 1, T = 6;
  model::Gpt m(tiny(), kernels::Precision::fp32, false);
  std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
  m.init_params(p.data(), 1);
  model::FlatParamStore st(m.layout(), p.data(), g.data());
  for (int32_t bad : {24, 1 << 30, -3}) {  // 24: the padded table has 24 rows (0..23)
    std::vector<int32_t> tok(B * T, 1), tgt(B * T, 2);
    tok[3] = bad;
    try {
      m.forward_backward(st, tok.data(), tgt.data(), B, T, 1.0f);
      FAIL() << "token " << bad << " accepted";
    } catch (const hpct::Error& e) {
      EXPECT_NE(std::string(e.what()).find("token " + std::to_string(bad) + " at position 3 is outside the vocabulary"),
                std::string::npos) << e.what();
    }
  }
}

// Every tensor declares how it starts, with the tensor (no name-matching): norm weights one, biases
// zero, the projections into the residual stream N(0, std/sqrt(2L)), other weights N(0, std); LoRA's
// B of a linear and A of the embedding zero. Checked on a dense, a residual-MoE and a LoRA layout,
// by kind and by the drawn values' spread (4096-element tensors: the sample std is within 5%).
TEST(Gpt, EveryTensorDeclaresItsInitialisation) {
  model::GptConfig dense = tiny();
  dense.hidden_size = 64;
  dense.init_std = 0.02;
  model::GptConfig moe = dense;
  moe.moe.num_experts = {2};
  moe.moe.residual = true;
  model::GptConfig lora = dense;
  lora.lora.rank = 4;
  lora.lora.targets = 0x1F;
  for (const auto& cfg : {dense, moe, lora}) {
    const ParamLayout L = model::Gpt::layout_for(cfg);
    model::Gpt m(cfg, kernels::Precision::fp32, false);
    std::vector<float> p(L.numel());
    m.init_params(p.data(), 11);
    const double out_std = cfg.init_std / std::sqrt(2.0 * cfg.num_layers);
    for (const auto& t : L.tensors()) {
      const std::string& n = t.name;
      auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
      using K = InitSpec::Kind;
      ASSERT_NE(t.init.kind, K::unset) << n;
      if (ends("layernorm.weight")) EXPECT_EQ(t.init.kind, K::ones) << n;
      else if (ends(".bias") || (n.find(".lora_b.") != std::string::npos && n.rfind("embedding.", 0) != 0) ||
               n == "embedding.word_embeddings.lora_a.weight")
        EXPECT_EQ(t.init.kind, K::zeros) << n;
      else if (ends("attention.dense.weight") || ends("dense_4h_to_h.weight"))
        EXPECT_EQ(t.init.std, out_std) << n;
      else if (n.find(".lora_") == std::string::npos)
        EXPECT_EQ(t.init.std, cfg.init_std) << n;
      const float* x = p.data() + t.offset;
      double ss = 0;
      for (size_t i = 0; i < t.numel; ++i) ss += double(x[i]) * x[i];
      if (t.init.kind == K::ones || t.init.kind == K::zeros)
        EXPECT_EQ(ss, t.init.kind == K::ones ? double(t.numel) : 0.0) << n;
      else if (t.numel >= 4096)
        EXPECT_NEAR(std::sqrt(ss / double(t.numel)), t.init.std, 0.05 * t.init.std) << n;
    }
  }
  // A tensor added without one is unset, which Gpt::init_block refuses by name.
  ParamLayout bare;
  bare.add("new.weight", {4}, true);
  EXPECT_EQ(bare.tensors()[0].init.kind, InitSpec::Kind::unset);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
