// Tensor parallelism on the CUDA backend against the same tensor-parallel model on the CPU backend,
// under mpirun with T = the world size (2): every rank runs a part of the model on a GPU (ranks may
// share one: the collectives go through host buffers, tensor_parallel.hpp) and the same part on the
// CPU; the loss and every gradient of this rank's part must agree. test_tensor_parallel checks the
// CPU's tensor-parallel model against the unsplit one, so agreement here carries that over.
// Variants: plain; sequence parallelism with recompute; documents (per-token positions in the
// vocab-parallel embedding); LoRA on every linear and the embedding (its vocabulary-slice rows and
// the adapters' sums); a residual MoE layer with sequence parallelism, and tensor-parallel experts.
// The Nccl tests run the same through NCCL on device buffers (set_device_comm), which needs a GPU per
// rank; with fewer they are SKIPPED (CMake runs them as test_tensor_parallel_nccl_np2).
// Without a CUDA device every test is SKIPPED.
// Tolerances as test_gpt_cuda's fp32 ones, per tensor against the larger of its own largest gradient
// and 1e-3 of the model's: 1e-4 (cuBLAS and the CPU sum in other orders; the vocabulary slice's
// embedding gradient and the positions' use atomics; the cross entropy's exp is the device's expf).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../engine/mpi_gtest_main.hpp"
#include "cuda_compare.hpp"
#include "hpct/comm/deadline.hpp"
#include "hpct/comm/gpu.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/gpt.hpp"

using namespace hpct;
using test::world;

namespace {

model::GptConfig tiny(int tp) { return test::tiny_gpt(tp); }

void compare(model::GptConfig c, bool recompute, bool nccl = false) {
  const auto& w = world();
  std::string why;
  if (!kernels::cuda_ops_available(&why)) GTEST_SKIP() << why;
  if (nccl && comm::gpu_count(&why) < w.node_local_size())
    GTEST_SKIP() << "NCCL needs a GPU per rank: " << w.node_local_size() << " ranks on this node, "
                 << comm::gpu_count(&why) << " GPU(s)";
  auto gpu_be = kernels::cuda_ops(w.node_local_rank());  // modulo the GPUs seen: ranks may share one
  const comm::Communicator* tp = w.size() > 1 ? &w : nullptr;
  std::unique_ptr<comm::NcclComm> device_comm;  // outlives the models
  if (nccl) {
    device_comm = comm::NcclComm::create(w.raw(), w.node_local_rank(), comm::steady_seconds() + 120, {}, &why);
    ASSERT_TRUE(device_comm) << why;
  }
  model::Gpt cpu(c, kernels::Precision::fp32, recompute, nullptr, nullptr, tp);
  model::Gpt gpu(c, kernels::Precision::fp32, recompute, gpu_be.get(), nullptr, tp);
  gpu.set_tensor_parallel_device_comm(device_comm.get(), 120);
  ASSERT_EQ(gpu.tensor_parallel().device_collectives(), nccl);
  cpu.set_routing_seed(5), gpu.set_routing_seed(5);
  test::WeightsOnBoth wb(cpu, gpu, *gpu_be, 1234);
  model::FlatParamStore &cs = wb.host, &gs = wb.device;
  const std::vector<float>& grads = wb.grads;
  const size_t n = grads.size();

  const int B = 2, T = 16;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  std::mt19937 g(7);
  std::uniform_int_distribution<int> d(0, 99);
  for (int i = 0; i < B * T; ++i) tokens[i] = d(g), targets[i] = d(g);
  targets[5] = -1;
  if (c.reset_position_ids) tokens[3] = tokens[10] = tokens[T + 7] = c.eod_token;
  const float dloss = 1.0f / (B * T);
  const double lc = cpu.forward_backward(cs, tokens.data(), targets.data(), B, T, dloss);
  const double lg = gpu.forward_backward(gs, tokens.data(), targets.data(), B, T, dloss);
  EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc)) << "loss sum, rank " << w.rank();

  std::vector<float> got(n);
  gpu_be->copy_to_host(got.data(), wb.dgrads.as<void>(), n * sizeof(float));
  test::expect_gradients_close(cpu.layout(), got, grads, 1e-4, gpu_be->name() + " rank " + std::to_string(w.rank()));
  const double ec = cpu.forward_loss(cs, tokens.data(), targets.data(), B, T);
  const double eg = gpu.forward_loss(gs, tokens.data(), targets.data(), B, T);
  EXPECT_NEAR(eg, ec, 1e-4 * std::fabs(ec));
  // The same collectives, the same bytes: the device run stages them, it does not add any.
  EXPECT_EQ(gpu.tensor_parallel().bytes(), cpu.tensor_parallel().bytes());
}

}  // namespace

TEST(TensorParallelCuda, GptMatchesTheCpu) { compare(tiny(world().size()), false); }
TEST(TensorParallelCuda, SequenceParallelWithRecomputeMatchesTheCpu) {
  model::GptConfig c = tiny(world().size());
  c.sequence_parallel = true;
  compare(c, true);
}
TEST(TensorParallelCuda, DocumentsMatchTheCpu) {
  model::GptConfig c = tiny(world().size());
  c.reset_attention_mask = c.reset_position_ids = true;
  c.eod_token = 42;
  compare(c, false);
}
TEST(TensorParallelCuda, LoraMatchesTheCpu) {
  model::GptConfig c = tiny(world().size());
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.targets = 0x1F;
  compare(c, false);
}

// MoE layers: the dense part split, the experts whole on every rank (routing the same rows) or split
// (--enable-expert-tensor-parallelism: their partial outputs all-reduced through the host); a
// residual MoE's dense MLP split like a dense layer's. fp32, so the routes match (test_gpt_cuda).
static model::GptConfig tiny_moe(bool residual, bool etp) {
  model::GptConfig c = tiny(world().size());
  c.moe.num_experts = {4};
  c.moe.expert_interval = 2;
  c.moe.topk = 2;
  c.moe.residual = residual;
  c.moe.expert_tensor_parallel = etp;
  c.moe.train_capacity_factor = c.moe.eval_capacity_factor = 0.75;
  c.moe.min_capacity = 1;
  return c;
}
TEST(TensorParallelCuda, SequenceParallelResidualMoeMatchesTheCpu) {
  model::GptConfig c = tiny_moe(true, false);
  c.sequence_parallel = true;
  compare(c, false);
}
TEST(TensorParallelCuda, ExpertTensorParallelMoeMatchesTheCpu) { compare(tiny_moe(false, true), true); }

// Through NCCL on device buffers: the all-reduces (and the cross entropy's max and double sums), the
// sequence-parallel all-gather and reduce-scatter, and the split experts' all-reduce.
TEST(TensorParallelCuda, NcclGptMatchesTheCpu) { compare(tiny(world().size()), false, true); }
TEST(TensorParallelCuda, NcclSequenceParallelMatchesTheCpu) {
  model::GptConfig c = tiny(world().size());
  c.sequence_parallel = true;
  compare(c, true, true);
}
TEST(TensorParallelCuda, NcclExpertTensorParallelMoeMatchesTheCpu) { compare(tiny_moe(false, true), false, true); }

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
