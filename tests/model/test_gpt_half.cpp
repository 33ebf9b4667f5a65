// What the model keeps in 16 bits and what it shares, on the staged test backend (a device's
// memory protocol on the CPU): GEMM inputs (bitwise the fp32 layout's), the GELU MLP's
// pre-activation and the LM head's logits (within their rounding), and the attention inputs the
// layers share where the kernel keeps its own copy (bitwise), attention's 16-bit gradient (all but
// qkv's bias gradient bitwise) and the attention output handed back to the op's backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hpct/kernels/backend.hpp"
#include "hpct/model/gpt.hpp"
#include "gpt_test_models.hpp"
#include "staged_cpu_ops.hpp"

using namespace hpct;
using test::documents, test::fixed_batch, test::kB, test::kT, test::layer_lora, test::llama_like, test::tiny,
    test::two_experts, test::with_dropout, test::HalfCopyStore;

namespace {

// |a - b|_2 / |b|_2.
double rel_norm(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(d / n);
}

// One training step of cfg on the fixed batch (dropout seed 9 from sample 100, parameters seed 7)
// on a staged backend that `setup` configures.
struct Step {
  double loss = 0;
  std::vector<float> grads;
  size_t bytes = 0;       // Gpt::activation_bytes
  bool half_pre = false;  // Gpt::keeps_half_pre_activations
  int outputs_read = 0, output_mismatches = 0;  // the staged attention's (set_attention_reads_output)
};
Step staged_step(const model::GptConfig& cfg, kernels::Precision prec, bool recompute,
                 const std::function<void(test::StagedCpuOps&)>& setup) {
  const auto batch = fixed_batch();
  test::StagedCpuOps be;
  setup(be);
  model::Gpt m(cfg, prec, recompute, &be);
  m.set_dropout_seed(9, 100);
  std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
  m.init_params(p.data(), 7);
  model::FlatParamStore st(m.layout(), p.data(), g.data());
  Step s;
  s.loss = m.forward_backward(st, batch.first.data(), batch.second.data(), kB, kT, 1.0f);
  s.grads = std::move(g);
  s.bytes = m.activation_bytes();
  s.half_pre = m.keeps_half_pre_activations();
  s.outputs_read = be.outputs_read(), s.output_mismatches = be.output_mismatches();
  return s;
}

}  // namespace

// Where the backend asks for it, the GEMMs' inputs (the norms', attention's, the MLP activation's
// outputs) are kept in 16 bits (Gpt::keeps_half_activations). Every reader of them is a GEMM that
// rounds its input to the same 16 bits anyway, so a step computes bitwise what it computes with
// fp32 activations: checked on the staged backend (which writes the 16-bit form through a rounded
// copy and widens it back for its GEMMs), bf16 and fp16, for GPT, the Llama options, LoRA on the
// layers' linears, recompute and dropout, and with the weights' 16-bit copies too (both GEMM
// inputs then come only in 16 bits), and MoE models (top-1 and residual MoE), whose MoE layers keep
// their ln2 and the residual MLP's activation in fp32 (the router and the row moves read them).
// Sequence parallelism and embedding adapters keep fp32 (their readers are not GEMMs), as does a
// backend that does not ask.
TEST(Gpt, HalfActivationsChangeNoBit) {
  const model::GptConfig llama = llama_like();
  const model::GptConfig lora = layer_lora(), drop = with_dropout(0.1, 0.1), moe = two_experts();
  model::GptConfig rmoe = two_experts();
  rmoe.moe.residual = true;
  const auto batch = fixed_batch();  // named, not bound: C++17 lambdas cannot capture structured bindings
  const std::vector<int32_t>&tok = batch.first, &tgt = batch.second;
  struct Run {
    double loss;
    std::vector<float> grads;
    size_t bytes;
    bool half;
  };
  auto step = [&](const model::GptConfig& cfg, kernels::Precision prec, bool recompute, bool half, bool copies) {
    test::StagedCpuOps be;
    be.set_half_activations(half);
    be.prefer_half(copies);
    model::Gpt m(cfg, prec, recompute, &be);
    m.set_dropout_seed(9, 100);
    std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
    m.init_params(p.data(), 7);
    model::FlatParamStore flat(m.layout(), p.data(), g.data());
    std::optional<HalfCopyStore> store16;
    if (copies) store16.emplace(m.layout(), p, g.data(), prec);
    model::ParamStore& st = copies ? static_cast<model::ParamStore&>(*store16) : flat;
    const double loss = m.forward_backward(st, tok.data(), tgt.data(), kB, kT, 1.0f);
    return Run{loss, g, m.activation_bytes(), m.keeps_half_activations()};
  };
  for (auto prec : {kernels::Precision::bf16, kernels::Precision::fp16})
    for (const auto& [name, cfg] : {std::pair{"gpt", tiny()}, std::pair{"llama", llama}, std::pair{"lora", lora},
                                    std::pair{"dropout", drop}, std::pair{"moe", moe}, std::pair{"residual moe", rmoe}})
      for (bool recompute : {false, true}) {
        const std::string what = std::string(name) + " " + kernels::precision_name(prec) + (recompute ? " recompute" : "");
        const Run want = step(cfg, prec, recompute, false, false);
        EXPECT_FALSE(want.half) << what;
        for (bool copies : {false, true}) {
          const Run got = step(cfg, prec, recompute, true, copies);
          EXPECT_TRUE(got.half) << what;
          EXPECT_EQ(got.loss, want.loss) << what << (copies ? ", 16-bit weights" : "");
          EXPECT_EQ(got.grads, want.grads) << what << (copies ? ", 16-bit weights" : "");
          EXPECT_LT(got.bytes, want.bytes) << what << ": the workspace did not shrink";
        }
      }
  // Kept in fp32: an fp32 run, the embedding's adapters.
  model::GptConfig emb = tiny();
  emb.lora.rank = 4;
  emb.lora.targets = 0x1F;
  EXPECT_FALSE(step(tiny(), kernels::Precision::fp32, false, true, false).half);
  EXPECT_FALSE(step(emb, kernels::Precision::bf16, false, true, false).half);
}

// Where the backend asks for it (OpsBackend::half_logits), the LM head keeps its logits and their
// gradient in 16 bits, as PyTorch's autocast does: the loss is then that of the rounded logits, no
// longer bitwise the fp32 head's. On the staged backend (the default ops: fp32 products rounded
// once, the cross entropy on the widened values), against the same step with fp32 logits, bf16 and
// fp16, GPT (tied head) and the Llama options (untied), with and without 16-bit activations:
// the loss within 5e-4 (bf16) / 1e-4 (fp16) relative and the gradients within 1e-2 / 2e-3 of their
// norm (seen: 9e-5 / 1e-5 and 4.4e-3 / 5.3e-4). Why those: a logit rounds by at most 2^-9 (bf16) or
// 2^-12 (fp16) of itself and a token's loss moves by a weighted mean of its logits' errors, so the
// loss by well under 2^-9 of itself; the gradient comes through dlogits rounded the same way and
// probabilities moved by as much, about 2 x 2^-9 norm-wise, given some margin. The loss
// must differ (the 16-bit head ran) and the workspace shrink; adapters on the embedding keep fp32.
TEST(Gpt, HalfLogitsStayWithinTheirRounding) {
  const auto batch = fixed_batch();
  const std::vector<int32_t>& tok = batch.first;
  std::vector<int32_t> tgt = batch.second;
  tgt[3] = tgt[7] = -1;  // ignored positions: no loss, a zero gradient row
  auto step = [&](const model::GptConfig& cfg, kernels::Precision prec, bool half_logits, bool half_acts) {
    test::StagedCpuOps be;
    be.set_half_logits(half_logits);
    be.set_half_activations(half_acts);
    be.set_head_rows(5);  // several row blocks, the last one short, the head's gradient accumulated over them
    model::Gpt m(cfg, prec, false, &be);
    std::vector<float> p(m.layout().numel()), g(p.size(), 0.0f);
    m.init_params(p.data(), 7);
    model::FlatParamStore st(m.layout(), p.data(), g.data());
    const double loss = m.forward_backward(st, tok.data(), tgt.data(), kB, kT, 0.5f);
    return std::make_tuple(loss, g, m.activation_bytes(), m.keeps_half_logits());
  };
  for (auto prec : {kernels::Precision::bf16, kernels::Precision::fp16})
    for (const model::GptConfig& cfg : {tiny(), llama_like()})
      for (bool acts : {false, true}) {
        const std::string what = std::string(cfg.rotary ? "llama " : "gpt ") + kernels::precision_name(prec) +
                                 (acts ? ", 16-bit activations" : "");
        const auto [want_loss, want_g, want_bytes, want_half] = step(cfg, prec, false, acts);
        const auto [loss, g, bytes, half] = step(cfg, prec, true, acts);
        const bool bf = prec == kernels::Precision::bf16;
        EXPECT_FALSE(want_half) << what;
        EXPECT_TRUE(half) << what;
        EXPECT_NE(loss, want_loss) << what << ": the 16-bit head did not run";
        EXPECT_NEAR(loss, want_loss, (bf ? 5e-4 : 1e-4) * std::fabs(want_loss)) << what;
        EXPECT_LE(rel_norm(g, want_g), bf ? 1e-2 : 2e-3) << what;
        EXPECT_LT(bytes, want_bytes) << what << ": the logits' row block did not shrink";
      }
  model::GptConfig emb = tiny();
  emb.lora.rank = 4;
  emb.lora.targets = 0x1F;
  EXPECT_FALSE(std::get<3>(step(emb, kernels::Precision::bf16, true, false))) << "embedding adapters keep fp32 logits";
  EXPECT_FALSE(std::get<3>(step(tiny(), kernels::Precision::fp32, true, false))) << "an fp32 run";
}

// Where the backend asks for it (OpsBackend::half_pre_activations), a GELU MLP's pre-activation
// (fc's output, which only GELU and its backward read) is kept in 16 bits beside the 16-bit GEMM
// inputs, as autocast keeps a bf16 linear's output: GELU reads the rounded value, so the step is
// no longer bitwise the fp32 layout's; its gradient is kept in 16 bits too (fc's GEMMs round it
// anyway, so only fc's bias gradient, the sum of the rounded values, moves by that). On the staged
// backend (the default ops: the fp32 sum rounded once, widened back for GELU and for its backward,
// the gradient rounded once), against the same step with fp32
// pre-activations: bf16 and fp16, GPT with and without dropout and recompute, the loss within 2e-3
// (bf16) / 2e-4 (fp16) relative and the gradients within 2e-2 / 3e-3 of their norm (seen at most
// 2.9e-4 / 6.0e-5 and 6.9e-3 / 8.6e-4, with dropout). Why those: a pre-activation rounds by at most 2^-9 (bf16) or 2^-11
// (fp16) of itself, GELU's output and slope move by about as much relative, and the loss and the
// gradients follow linearly; a few times that, as a norm. The loss must differ (the 16-bit path
// ran) and the workspace shrink by the halved arrays exactly; SwiGLU, an adapter on fc and MoE
// layers keep fp32 (their bits unchanged).
TEST(Gpt, HalfPreActivationsStayWithinTheirRounding) {
  const model::GptConfig lora = layer_lora(), moe = two_experts();  // lora: fc among the adapted linears
  auto step = [](const model::GptConfig& cfg, kernels::Precision prec, bool recompute, bool pre) {
    return staged_step(cfg, prec, recompute, [pre](test::StagedCpuOps& be) {
      be.set_half_activations(true);
      be.set_half_pre_activations(pre);
    });
  };
  for (auto prec : {kernels::Precision::bf16, kernels::Precision::fp16}) {
    const bool bf = prec == kernels::Precision::bf16;
    for (const auto& [name, cfg] : {std::pair{"gpt", tiny()}, std::pair{"dropout", with_dropout(0.1, 0.1)}})
      for (bool recompute : {false, true}) {
        const std::string what = std::string(name) + " " + kernels::precision_name(prec) + (recompute ? " recompute" : "");
        const Step want = step(cfg, prec, recompute, false), got = step(cfg, prec, recompute, true);
        EXPECT_FALSE(want.half_pre) << what;
        EXPECT_TRUE(got.half_pre) << what;
        EXPECT_NE(got.loss, want.loss) << what << ": the 16-bit pre-activations did not run";
        EXPECT_NEAR(got.loss, want.loss, (bf ? 2e-3 : 2e-4) * std::fabs(want.loss)) << what;
        EXPECT_LE(rel_norm(got.grads, want.grads), bf ? 2e-2 : 3e-3) << what;
        const size_t n = kB * kT * 4 * cfg.hidden_size, sets = recompute ? 1 : cfg.num_layers;
        EXPECT_EQ(want.bytes - got.bytes, sets * (n - (n + 7) / 8 * 4) * sizeof(float)) << what;
      }
    for (const auto& [name, cfg] : {std::pair{"llama", llama_like()}, std::pair{"lora", lora}, std::pair{"moe", moe}}) {
      const Step want = step(cfg, prec, false, false), got = step(cfg, prec, false, true);
      EXPECT_EQ(got.half_pre, std::string(name) == "moe") << name << ": MoE sets keep fp32, the rest do not ask";
      EXPECT_EQ(got.loss, want.loss) << name;
      EXPECT_EQ(got.grads, want.grads) << name;
      EXPECT_EQ(got.bytes, want.bytes) << name;
    }
  }
}

// Where the backend's attention kernel keeps its inputs in its own state (a fused kernel's 16-bit
// q, k, v: AttentionKernel::keeps_inputs), the layers share one qkv buffer instead of keeping one
// each: the staged backend's attention then copies qkv into its state and its backward reads only
// that copy, so a model that still read a layer's qkv after the next layer's forward (two layers
// here) would get other gradients. Bitwise the same loss and gradients as the same backend keeping
// every layer's qkv, for GPT, grouped heads with rotary positions (the widened heads live in the
// shared buffer too), attention dropout, per-document masks, LoRA on qkv and MoE, fp32 and bf16;
// the workspace is the per-layer buffers smaller (less the test backend's copies). With recompute
// there is one activation set, so nothing to share.
TEST(Gpt, LayersShareTheAttentionInputsWhereTheKernelKeepsThem) {
  model::GptConfig grouped = llama_like();
  const model::GptConfig docs = documents(), lora = layer_lora(), moe = two_experts();
  grouped.num_kv_heads = 1;
  auto step = [](const model::GptConfig& cfg, kernels::Precision prec, bool recompute, bool keeps) {
    return staged_step(cfg, prec, recompute, [keeps](test::StagedCpuOps& be) { be.set_attention_keeps_inputs(keeps); });
  };
  for (auto prec : {kernels::Precision::fp32, kernels::Precision::bf16})
    for (const auto& [name, cfg] : {std::pair{"gpt", tiny()}, std::pair{"grouped", grouped},
                                    std::pair{"dropout", with_dropout(0.1, 0.1)}, std::pair{"documents", docs},
                                    std::pair{"lora", lora}, std::pair{"moe", moe}})
      for (bool recompute : {false, true}) {
        const std::string what = std::string(name) + " " + kernels::precision_name(prec) + (recompute ? " recompute" : "");
        const Step want = step(cfg, prec, recompute, false), got = step(cfg, prec, recompute, true);
        const double want_loss = want.loss, loss = got.loss;
        const std::vector<float>&want_g = want.grads, &g = got.grads;
        const size_t want_bytes = want.bytes, bytes = got.bytes;
        EXPECT_EQ(loss, want_loss) << what;
        EXPECT_EQ(g, want_g) << what;
        // Floats: the inputs of a set (qkv rows, and grouped the widened heads), the staged
        // kernel's copy of the heads in each set's state.
        const long long N = kB * kT, C = cfg.hidden_size, HS = C / cfg.num_heads, L = cfg.num_layers;
        const long long inputs = N * (C + 2 * cfg.kv_heads() * HS + (cfg.kv_heads() != cfg.num_heads ? 3 * C : 0));
        const long long sets = recompute ? 1 : L, copies = sets * N * 3 * C, shared = (sets - 1) * inputs;
        EXPECT_EQ((long long)bytes - (long long)want_bytes, (copies - shared) * 4) << what;
      }
}

// Where the attention kernel computes its input gradient in 16 bits (cuDNN's:
// AttentionKernel::half_gradient), the model hands that gradient to the qkv GEMMs as it is instead
// of widening it into an fp32 dqkv they round back. On the staged backend (the CPU kernel's fp32
// gradient rounded once, as cuDNN's comes out), against the same backend keeping an fp32 dqkv:
// the GEMMs round their input to p either way, so the loss and every gradient are bitwise the same
// except qkv's bias gradient, the sum of the rounded values instead of the unrounded ones (on the
// GPU the values were 16-bit already: there nothing changes). That bias gradient within 1e-2 (bf16)
// / 1.5e-3 (fp16) of its norm: each term moves by at most 2^-8 / 2^-11 of itself (half a 16-bit
// step), and a sum of terms of both signs by a few times that of its norm (seen at most 1.5e-3 /
// 1.7e-4). It must differ,
// or the 16-bit route did not run. GPT, dropout, per-document masks, MoE, recompute; grouped heads
// with rotary positions and an adapter on qkv read the gradient in fp32, so they keep it (bitwise),
// as do an fp32 run and one whose GEMM inputs are fp32.
TEST(Gpt, HalfAttentionGradientChangesOnlyTheQkvBias) {
  const model::GptConfig docs = documents(), lora = layer_lora(), moe = two_experts();  // lora: qkv among them
  auto step = [](const model::GptConfig& cfg, kernels::Precision prec, bool recompute, bool half, bool acts = true) {
    return staged_step(cfg, prec, recompute, [half, acts](test::StagedCpuOps& be) {
      be.set_half_activations(acts);
      be.set_attention_keeps_inputs(true);
      be.set_attention_half_gradient(half);
    });
  };
  // Moves every layer's qkv bias gradient out of g (left 0 there), in order.
  auto take_qkv_bias = [](const model::GptConfig& cfg, std::vector<float>& g) {
    auto be = kernels::cpu_ops();
    const model::Gpt m(cfg, kernels::Precision::fp32, false, be.get());
    std::vector<float> b;
    for (const auto& t : m.layout().tensors())
      if (t.name.find("query_key_value.bias") != std::string::npos) {
        b.insert(b.end(), g.begin() + t.offset, g.begin() + t.offset + t.numel);
        std::fill(g.begin() + t.offset, g.begin() + t.offset + t.numel, 0.0f);
      }
    return b;
  };
  for (auto prec : {kernels::Precision::bf16, kernels::Precision::fp16}) {
    const bool bf = prec == kernels::Precision::bf16;
    for (const auto& [name, cfg] : {std::pair{"gpt", tiny()}, std::pair{"dropout", with_dropout(0.1, 0.1)},
                                    std::pair{"documents", docs}, std::pair{"moe", moe}})
      for (bool recompute : {false, true}) {
        const std::string what = std::string(name) + " " + kernels::precision_name(prec) + (recompute ? " recompute" : "");
        Step want = step(cfg, prec, recompute, false), got = step(cfg, prec, recompute, true);
        EXPECT_EQ(got.loss, want.loss) << what;
        const std::vector<float> b = take_qkv_bias(cfg, got.grads), want_b = take_qkv_bias(cfg, want.grads);
        ASSERT_EQ(b.size(), (size_t)cfg.num_layers * 3 * cfg.hidden_size) << what;
        EXPECT_NE(b, want_b) << what << ": the 16-bit gradient did not run";
        EXPECT_LE(rel_norm(b, want_b), bf ? 1e-2 : 1.5e-3) << what;
        EXPECT_EQ(got.grads, want.grads) << what << ": a gradient besides qkv's bias moved";
      }
    for (const auto& [name, cfg] : {std::pair{"llama", llama_like()}, std::pair{"lora", lora}}) {
      const Step want = step(cfg, prec, false, false), got = step(cfg, prec, false, true);
      EXPECT_EQ(got.loss, want.loss) << name;
      EXPECT_EQ(got.grads, want.grads) << name << ": kept in fp32";
    }
  }
  const Step want = step(tiny(), kernels::Precision::fp32, false, false), got = step(tiny(), kernels::Precision::fp32, false, true);
  EXPECT_EQ(got.grads, want.grads) << "an fp32 run";
  const auto bf16 = kernels::Precision::bf16;
  EXPECT_EQ(step(tiny(), bf16, false, true, false).grads, step(tiny(), bf16, false, false, false).grads)
      << "fp32 GEMM inputs (the qkv GEMMs would narrow ln1 for a 16-bit gradient)";
}

// Where the model keeps its attention output in 16 bits (the proj GEMM's input, atty), it tells the
// attention op so (AttentionUse::output_kept) and hands that output back to its backward, so a
// kernel that reads its output there (cuDNN's) keeps no second copy in its state. On the staged
// backend, whose attention then records the 16-bit output forward wrote for each state and
// compares what backward is given: every layer's backward gets its own layer's output, unchanged
// (the right set, not overwritten by a later layer, recomputed where recompute runs the forward
// again), for GPT, dropout, per-document masks, grouped heads with rotary positions, LoRA on the
// layers' linears and MoE, bf16 and fp16, with and without recompute; the step bitwise the same
// as without the check. Without 16-bit activations (fp32, or a backend that does not ask) the
// output is not kept so, and nothing is read.
TEST(Gpt, AttentionReadsTheOutputTheModelKept) {
  const model::GptConfig docs = documents(), lora = layer_lora(), moe = two_experts();
  model::GptConfig grouped = llama_like();
  grouped.num_kv_heads = 1;
  auto step = [](const model::GptConfig& cfg, kernels::Precision prec, bool recompute, bool half, bool reads) {
    return staged_step(cfg, prec, recompute, [half, reads](test::StagedCpuOps& be) {
      be.set_half_activations(half);
      be.set_attention_reads_output(reads);
    });
  };
  for (auto prec : {kernels::Precision::bf16, kernels::Precision::fp16})
    for (const auto& [name, cfg] : {std::pair{"gpt", tiny()}, std::pair{"dropout", with_dropout(0.1, 0.1)},
                                    std::pair{"documents", docs}, std::pair{"grouped", grouped},
                                    std::pair{"lora", lora}, std::pair{"moe", moe}})
      for (bool recompute : {false, true}) {
        const std::string what = std::string(name) + " " + kernels::precision_name(prec) + (recompute ? " recompute" : "");
        const Step want = step(cfg, prec, recompute, true, false), got = step(cfg, prec, recompute, true, true);
        EXPECT_EQ(got.outputs_read, cfg.num_layers) << what << ": one read per layer's backward";
        EXPECT_EQ(got.output_mismatches, 0) << what;
        EXPECT_EQ(got.loss, want.loss) << what;
        EXPECT_EQ(got.grads, want.grads) << what;
      }
  EXPECT_EQ(step(tiny(), kernels::Precision::fp32, false, true, true).outputs_read, 0) << "an fp32 run";
  EXPECT_EQ(step(tiny(), kernels::Precision::bf16, false, false, true).outputs_read, 0) << "fp32 activations";
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kernels::BackendScope backend;
  return RUN_ALL_TESTS();
}
