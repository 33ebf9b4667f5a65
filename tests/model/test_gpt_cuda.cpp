// GPT on the CUDA backend against the same model on the CPU backend: the loss and every gradient
// of one forward-backward, with and without activation recompute, in fp32 and bf16; evaluation;
// and the host-side refusal of a bad token. The CPU model's gradients are checked against finite
// differences in test_gpt.cpp and test_moe.cpp, so agreement here carries that over. The MoE variants
// (top-1 with router jitter, top-2 Residual-MoE with recompute; tokens dropped) compare the routing
// too, in fp32 only: in bf16 the two backends' router inputs differ by bf16 rounding, enough to flip
// near-tied routes, after which gradients differ by design. Without a CUDA device every test is
// SKIPPED (CTest reports the test as skipped, not passed).
// Tolerances, per tensor against the larger of its own largest gradient and 1e-3 of the model's
// (so a tensor of small gradients is judged at its own scale): fp32 1e-4 (cuBLAS and the CPU sum in
// different orders, and the token-embedding gradient uses atomics); bf16 1e-2 (the CPU rounds GEMM
// inputs to bf16; cuBLAS is allowed to, not forced, so the two differ by up to bf16's rounding).
// Where the GPU keeps the LM head's logits, the GELU MLP's pre-activation or attention's gradient
// in 16 bits (OpsBackend::half_logits, half_pre_activations, AttentionKernel::half_gradient), the
// CPU model does too (the staged test backend:
// the CPU's ops with those values rounded at the same points), so the comparison stays like for
// like and the tolerances above still hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/backend.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/gpt.hpp"
#include "staged_cpu_ops.hpp"
#include "cuda_compare.hpp"

using namespace hpct;
using kernels::BackendBuffer;
using kernels::Precision;

namespace {

class Env : public ::testing::Environment {
 public:
  void SetUp() override { scope_ = std::make_unique<kernels::BackendScope>(); }
  void TearDown() override { scope_.reset(); }

 private:
  std::unique_ptr<kernels::BackendScope> scope_;
};
[[maybe_unused]] const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Env);

model::GptConfig tiny() { return test::tiny_gpt(); }

struct Batch {
  int B = 3, T = 16;
  std::vector<int32_t> tokens, targets;
  explicit Batch(uint64_t seed) {
    std::mt19937 g(static_cast<unsigned>(seed));
    std::uniform_int_distribution<int> d(0, 99);
    for (int i = 0; i < B * T; ++i) tokens.push_back(d(g)), targets.push_back(d(g));
    targets[5] = -1;  // an ignored position
  }
};

// The tiny GPT with its second layer an MoE layer of 4 experts that drops tokens (capacity factor
// 0.75), with the aux and z losses on: top-1 with router jitter, or top-2 Residual-MoE.
model::GptConfig tiny_moe(int topk, bool residual) {
  model::GptConfig c = tiny();
  c.moe.num_experts = {4};
  c.moe.expert_interval = 2;
  c.moe.topk = topk;
  c.moe.residual = residual;
  c.moe.train_capacity_factor = c.moe.eval_capacity_factor = 0.75;
  c.moe.min_capacity = 1;
  c.moe.noisy_gate_policy = topk == 1 ? "Jitter" : "None";
  c.moe.loss_coeff = 0.1;
  c.moe.z_loss_coeff = 0.05;
  return c;
}

// ltd_kept > 0: random-LTD in layer 1, keeping that many of each sample's tokens.
// fused: the GPU model's attention through cuDNN's fused kernel (bf16/fp16 only); otherwise the
// materialised kernel on both, so the other kernels are held to the tighter tolerance.
void compare_one_step(Precision p, bool recompute, double tol, const model::GptConfig& c = tiny(), int ltd_kept = 0,
                      bool fused = false) {
  std::string why;
  if (!kernels::cuda_ops_available(&why)) GTEST_SKIP() << why;
  auto gpu_be = kernels::cuda_ops(0);
  gpu_be->allow_fused_attention(fused);
  test::StagedCpuOps cpu_be;
  cpu_be.set_half_logits(gpu_be->half_logits(p));
  // Where the GPU keeps the GELU MLP's pre-activation in 16 bits, so does the CPU model (with
  // 16-bit GEMM inputs, which on the staged backend change no bit).
  cpu_be.set_half_activations(gpu_be->half_pre_activations(p));
  cpu_be.set_half_pre_activations(gpu_be->half_pre_activations(p));
  model::Gpt cpu(c, p, recompute, &cpu_be);
  model::Gpt gpu(c, p, recompute, gpu_be.get());
  const Batch shape(0);
  const kernels::AttentionKernel kernel = gpu.attention_kernel(shape.B, shape.T);
  if (fused && !kernel.fused && kernel.what.find("multiple of 128") != std::string::npos)
    GTEST_SKIP() << kernel.what;  // cuDNN up to 9.15.0: T = 16 is not a multiple of 128
  ASSERT_EQ(kernel.fused, fused) << kernel.what;
  // Where the GPU's attention gradient is 16-bit (cuDNN's), the GPU model hands it to the qkv GEMMs
  // in 16 bits; the CPU model's is rounded there too (Attention::half_gradient).
  cpu_be.set_attention_half_gradient(kernel.half_gradient);
  // 16-bit runs keep the GEMM inputs in 16 bits on the GPU (an MoE layer's ln2 excepted; the
  // tolerances above cover them: each is the rounding the GEMM would have made); the CPU never does.
  // (The embedding-adapter cases, which keep fp32, are fp32 runs.)
  EXPECT_EQ(gpu.keeps_half_activations(), p != Precision::fp32);
  EXPECT_EQ(cpu.keeps_half_pre_activations(), gpu.keeps_half_pre_activations());
  cpu.set_routing_seed(5), gpu.set_routing_seed(5);
  cpu.set_dropout_seed(11, 300), gpu.set_dropout_seed(11, 300);
  if (ltd_kept > 0)
    for (model::Gpt* m : {&cpu, &gpu}) {
      m->set_random_ltd_layers({1});
      m->set_kept_tokens(ltd_kept, 21, 300);
    }
  test::WeightsOnBoth wb(cpu, gpu, *gpu_be, 1234);
  model::FlatParamStore &cs = wb.host, &gs = wb.device;
  const std::vector<float>& grads = wb.grads;
  const size_t n = grads.size();

  Batch b(7);
  if (c.reset_attention_mask || c.reset_position_ids)  // documents of 4, 7, 5; of 8, 8; one of 16
    b.tokens[3] = b.tokens[10] = b.tokens[b.T + 7] = c.eod_token;
  const float dloss = 1.0f / static_cast<float>(b.B * b.T);
  const double lc = cpu.forward_backward(cs, b.tokens.data(), b.targets.data(), b.B, b.T, dloss);
  const double lg = gpu.forward_backward(gs, b.tokens.data(), b.targets.data(), b.B, b.T, dloss);
  EXPECT_NEAR(lg, lc, tol * std::fabs(lc)) << "loss sum on " << gpu_be->name();
  // MoE: the gate sees the router's logits from either backend; the same routes must come out
  // (a flip would be a near-tie of two logits, which the fixed seed and weights do not have).
  ASSERT_EQ(gpu.moe_stats().size(), cpu.moe_stats().size());
  for (size_t i = 0; i < cpu.moe_stats().size(); ++i) {
    EXPECT_EQ(gpu.moe_stats()[i].routing_hash, cpu.moe_stats()[i].routing_hash) << "MoE layer " << i;
    EXPECT_GT(cpu.moe_stats()[i].dropped, 0) << "capacity factor 0.75 must drop routes";
    EXPECT_NEAR(gpu.moe_stats()[i].aux_loss, cpu.moe_stats()[i].aux_loss, 1e-5);
  }

  std::vector<float> g(n);
  gpu_be->copy_to_host(g.data(), wb.dgrads.as<void>(), n * sizeof(float));
  test::expect_gradients_close(cpu.layout(), g, grads, tol, gpu_be->name());

  // Evaluation on the same weights.
  const double ec = cpu.forward_loss(cs, b.tokens.data(), b.targets.data(), b.B, b.T);
  const double eg = gpu.forward_loss(gs, b.tokens.data(), b.targets.data(), b.B, b.T);
  EXPECT_NEAR(eg, ec, tol * std::fabs(ec));
}

}  // namespace

TEST(GptCuda, Fp32MatchesTheCpu) { compare_one_step(Precision::fp32, false, 1e-4); }
TEST(GptCuda, Fp32WithRecomputeMatchesTheCpu) { compare_one_step(Precision::fp32, true, 1e-4); }
TEST(GptCuda, Bf16MatchesTheCpu) { compare_one_step(Precision::bf16, false, 1e-2); }
// cuDNN's fused attention in the GPU model: besides the GEMMs' rounding, q, k, v, the probabilities
// before P V, the output, dout and dS are rounded to bf16 (each up to 2^-9 relative), so 3e-2;
// with recompute its replayed forward must give the state backward reads.
TEST(GptCuda, Bf16FusedAttentionMatchesTheCpu) {
  compare_one_step(Precision::bf16, false, 3e-2, tiny(), 0, true);
  compare_one_step(Precision::bf16, true, 3e-2, tiny(), 0, true);
}
// Per-document attention on the fused kernel (the keys the model copies in), same tolerance.
TEST(GptCuda, Bf16FusedAttentionWithDocumentsMatchesTheCpu) {
  model::GptConfig c = tiny();
  c.reset_attention_mask = c.reset_position_ids = true;
  c.eod_token = 42;
  compare_one_step(Precision::bf16, true, 3e-2, c, 0, true);
}
// LoRA on the layers' linears with the fused kernel, same tolerance: the active qkv hook keeps
// attention's gradient in fp32, the proj hook reads the output the model kept for the kernel.
TEST(GptCuda, Bf16FusedAttentionWithLoraMatchesTheCpu) {
  model::GptConfig c = tiny();
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.targets = 0x0F;
  compare_one_step(Precision::bf16, true, 3e-2, c, 0, true);
}
// cuDNN's attention dropout in the model: its mask is cuDNN's, so the CPU is no reference here
// (test_ops_backend_cuda's FusedAttentionDropout checks the op against the CPU with the mask read
// off). The recomputed forward (activation recompute) must draw the kept forward's mask: the loss
// and every gradient of one step with and without recompute agree within 1e-5 of the largest (the
// same kernels; the embedding's atomic scatter sums in a varying order), and dropping changes the
// loss against the evaluation's.
TEST(GptCuda, Bf16FusedAttentionDropoutRecomputesTheSameMask) {
  std::string why;
  if (!kernels::cuda_ops_available(&why)) GTEST_SKIP() << why;
  auto be = kernels::cuda_ops(0);
  model::GptConfig c = tiny();
  c.attention_dropout = 0.2;
  model::Gpt cpu(c, Precision::bf16, false), kept(c, Precision::bf16, false, be.get()),
      replayed(c, Precision::bf16, true, be.get());
  const Batch b(7);
  const kernels::AttentionKernel kernel = kept.attention_kernel(b.B, b.T);
  if (!kernel.fused && kernel.what.find("multiple of 128") != std::string::npos) GTEST_SKIP() << kernel.what;
  ASSERT_TRUE(kernel.fused) << kernel.what;
  kept.set_dropout_seed(11, 300), replayed.set_dropout_seed(11, 300);
  test::WeightsOnBoth wb(cpu, kept, *be, 1234);
  const size_t n = wb.grads.size();
  const float dloss = 1.0f / static_cast<float>(b.B * b.T);
  std::vector<float> g1(n), g2(n);
  const double l1 = kept.forward_backward(wb.device, b.tokens.data(), b.targets.data(), b.B, b.T, dloss);
  be->copy_to_host(g1.data(), wb.dgrads.as<void>(), n * sizeof(float));
  be->zero(wb.dgrads.as<void>(), n * sizeof(float));
  const double l2 = replayed.forward_backward(wb.device, b.tokens.data(), b.targets.data(), b.B, b.T, dloss);
  be->copy_to_host(g2.data(), wb.dgrads.as<void>(), n * sizeof(float));
  EXPECT_NEAR(l2, l1, 1e-6 * std::fabs(l1));
  test::expect_gradients_close(kept.layout(), g2, g1, 1e-5, be->name() + " (recompute against kept)");
  const double eval = kept.forward_loss(wb.device, b.tokens.data(), b.targets.data(), b.B, b.T);
  EXPECT_GT(std::fabs(l1 - eval), 1e-4 * std::fabs(eval)) << "attention dropout 0.2 should change the loss";
}
TEST(GptCuda, MoeTop1JitterMatchesTheCpu) { compare_one_step(Precision::fp32, false, 1e-4, tiny_moe(1, false)); }
// Dropout on every site: the device kernels draw the CPU's mask bits (kernels/dropout.hpp), so the
// same tolerances hold; with recompute the replayed forward must draw them again.
TEST(GptCuda, Fp32WithDropoutAndRecomputeMatchesTheCpu) {
  model::GptConfig c = tiny();
  c.attention_dropout = c.hidden_dropout = 0.1;
  compare_one_step(Precision::fp32, true, 1e-4, c);
}
// Documents packed in the samples: the device embedding reads per-token positions and the softmax
// each query's first key (copied in by the model); same tolerances.
TEST(GptCuda, Fp32WithDocumentsAndRecomputeMatchesTheCpu) {
  model::GptConfig c = tiny();
  c.reset_attention_mask = c.reset_position_ids = true;
  c.eod_token = 42;
  compare_one_step(Precision::fp32, true, 1e-4, c);
}
// random-LTD: the kept rows move by the backend's gather_rows / scatter_rows; with documents the
// kept rows' key starts are copied in too. Same tolerances.
TEST(GptCuda, Fp32WithRandomLtdDocumentsAndRecomputeMatchesTheCpu) {
  model::GptConfig c = tiny();
  c.reset_attention_mask = c.reset_position_ids = true;
  c.eod_token = 42;
  compare_one_step(Precision::fp32, true, 1e-4, c, 8);
}
// LoRA: the adapters' GEMMs and scaled adds on the device (the embedding's: its row gather, the
// head's extra logits and the scatter-add of its gradient), the frozen base without weight
// gradients (the store gives none); same tolerances.
TEST(GptCuda, Fp32LoraWithRecomputeMatchesTheCpu) {
  model::GptConfig c = tiny();
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.targets = 0x1F;
  compare_one_step(Precision::fp32, true, 1e-4, c);
}
// The position embedding training in its own block, the word embedding frozen (the encoder's
// backward without dwte).
TEST(GptCuda, Fp32LoraPositionsMatchTheCpu) {
  model::GptConfig c = tiny();
  c.lora.rank = 4;
  c.lora.modules_to_save = 1u << model::LoraConfig::position_embeddings;
  compare_one_step(Precision::fp32, false, 1e-4, c);
}
TEST(GptCuda, MoeTop2ResidualWithRecomputeMatchesTheCpu) {
  compare_one_step(Precision::fp32, true, 1e-4, tiny_moe(2, true));
}

// A token outside the vocabulary is refused on the host, before any kernel reads with it.
TEST(GptCuda, BadTokenRefusedOnTheHost) {
  std::string why;
  if (!kernels::cuda_ops_available(&why)) GTEST_SKIP() << why;
  auto gpu_be = kernels::cuda_ops(0);
  model::Gpt gpu(tiny(), Precision::fp32, false, gpu_be.get());
  const size_t n = gpu.layout().numel();
  BackendBuffer dparams(*gpu_be, n * sizeof(float)), dgrads(*gpu_be, n * sizeof(float));
  gpu_be->zero(dparams.as<void>(), n * sizeof(float));
  gpu_be->zero(dgrads.as<void>(), n * sizeof(float));
  model::FlatParamStore gs(gpu.layout(), dparams.as<float>(), dgrads.as<float>());
  Batch b(3);
  b.tokens[4] = 500;
  try {
    gpu.forward_backward(gs, b.tokens.data(), b.targets.data(), b.B, b.T, 1.0f);
    FAIL() << "a token of 500 in a 128-row vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 500 at position 4 is outside the vocabulary [0, 128)"), std::string::npos)
        << e.what();
  }
}
