// The memory planner against the ZeRO paper's formulas and published anchors, and Ψ against the
// model's own parameter table.
#include <gtest/gtest.h>

#include <algorithm>

#include "hpct/core/error.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/parallel/memory_estimate.hpp"

using namespace hpct;
using namespace hpct::parallel;

namespace {

// A GptSize with a chosen Ψ (the paper's anchors are stated for Ψ alone).
GptSize size_of(uint64_t psi, uint64_t largest = 1000) {
  GptSize s;
  s.params = psi;
  s.largest_block = largest;
  s.largest_block_name = "layer";
  return s;
}

ClusterShape gpus(int nodes, int per_node, double gpu_gb, double cpu_gb = 1e6, double nvme_gb = 1e6) {
  ClusterShape c;
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.device_bytes = (uint64_t)(gpu_gb * 1e9);
  c.host_bytes = (uint64_t)(cpu_gb * 1e9);
  c.nvme_bytes = (uint64_t)(nvme_gb * 1e9);
  return c;
}

model::GptConfig shape(int L, int C, int NH, int T, int V) {
  model::GptConfig g;
  g.num_layers = L;
  g.hidden_size = C;
  g.num_heads = NH;
  g.max_seq_length = T;
  g.vocab_size = V;
  return g;
}

}  // namespace

TEST(MemoryEstimate, ParamCountEqualsModelLayout) {
  auto narrow = shape(3, 96, 3, 40, 1000);
  narrow.ffn_hidden_size = 200;  // --ffn-hidden-size
  auto rms = shape(2, 64, 2, 64, 256);
  rms.normalization = model::NormKind::rmsnorm;  // norms without a bias
  auto glu = shape(2, 128, 2, 64, 256);
  glu.mlp = model::MlpKind::swiglu;  // fc 2F x C, F = int(4 x 128 x 2/3 / 64) x 64 = 320
  glu.linear_bias = false;           // and no linear biases
  glu.untie_embeddings = true;       // and an output layer of its own
  glu.rotary = true;                 // and no position table
  glu.num_kv_heads = 1;              // and one key/value head
  for (auto g : {shape(2, 64, 2, 64, 256), shape(4, 128, 4, 128, 512), shape(3, 96, 3, 40, 1000),
                 shape(12, 768, 12, 1024, 50257), shape(1, 32, 1, 7, 77), narrow, rms, glu}) {
    model::Gpt m(g, kernels::Precision::fp32, false);
    const GptSize s = gpt_size(g);
    EXPECT_EQ(s.params, m.layout().numel()) << g.describe();
    const auto& blocks = m.layout().blocks();
    const size_t untied = g.untie_embeddings ? 1 : 0;  // the output layer's block, last
    ASSERT_EQ(blocks.size(), (size_t)g.num_layers + 2 + untied);
    EXPECT_EQ(s.embedding, blocks.front().numel);
    EXPECT_EQ(s.layer, blocks[1].numel);
    EXPECT_EQ(s.final_norm, blocks[g.num_layers + 1].numel);
    EXPECT_EQ(s.output_layer, untied ? blocks.back().numel : 0u);
    size_t largest = 0;
    for (const auto& b : blocks) largest = std::max(largest, b.numel);
    EXPECT_EQ(s.largest_block, largest) << g.describe();
  }
}

// With tensor parallelism the counts are one rank's parts: what Gpt::layout_for holds per tp rank.
TEST(MemoryEstimate, TensorParallelCountsOneRanksParts) {
  for (int T : {2, 4}) {
    auto g = shape(12, 768, 12, 1024, 50257);
    g.tensor_parallel = T;
    const ParamLayout l = model::Gpt::layout_for(g, T - 1);
    const GptSize s = gpt_size(g);
    EXPECT_EQ(s.params, l.numel()) << "T=" << T;
    EXPECT_EQ(s.layer, l.blocks()[1].numel) << "T=" << T;
    EXPECT_EQ(l.full_numel(), gpt_size(shape(12, 768, 12, 1024, 50257)).params) << "the parts make the T=1 model";
  }
}

// MoE: Ψ is what a rank holds, the dense blocks and its E/EP experts of every MoE layer (each
// expert's part with expert tensor parallelism): the layout's dense blocks plus 1/EP of its expert
// blocks, for pyramid, residual and split-expert shapes.
TEST(MemoryEstimate, MoeCountsWhatARankHolds) {
  struct Case {
    int T, EP;
    std::vector<int> experts;
    bool residual, etp;
  };
  for (const Case& k : {Case{1, 1, {4}, false, false}, Case{1, 2, {4}, false, false}, Case{2, 2, {4, 8}, false, false},
                        Case{2, 4, {8}, true, false}, Case{2, 2, {4}, false, true}, Case{4, 2, {4, 8}, true, true}}) {
    auto g = shape(4, 64, 4, 32, 300);
    g.ffn_hidden_size = k.etp ? 96 : 0;  // --ffn-hidden-size in the split-expert cases
    if (k.residual) g.normalization = model::NormKind::rmsnorm;  // and RMSNorm in the residual ones
    if (k.EP == 2) g.mlp = model::MlpKind::swiglu;  // and SwiGLU at EP 2
    if (k.T == 2) g.linear_bias = false;            // and no linear biases at T 2
    if (k.T == 4) g.untie_embeddings = true;        // and an untied head at T 4
    if (k.T == 4) g.rotary = true;                  // and rotary positions
    if (k.T == 2) g.num_kv_heads = 2;               // and grouped-query attention
    g.tensor_parallel = k.T;
    g.moe.num_experts = k.experts;
    g.moe.residual = k.residual;
    g.moe.expert_tensor_parallel = k.etp;
    const ParamLayout l = model::Gpt::layout_for(g, k.T - 1);
    uint64_t dense = 0, experts = 0, largest = 0;
    for (const auto& b : l.blocks()) {
      (b.group == ReduceGroup::expert ? experts : dense) += b.numel;
      largest = std::max<uint64_t>(largest, b.numel);
    }
    const GptSize s = gpt_size(g, k.EP);
    const std::string what = "T=" + std::to_string(k.T) + " EP=" + std::to_string(k.EP) + (k.residual ? " residual" : "") +
                             (k.etp ? " split experts" : "");
    EXPECT_EQ(s.dense, dense) << what;
    EXPECT_EQ(s.experts, experts / k.EP) << what;
    EXPECT_EQ(s.params, dense + experts / k.EP) << what;
    EXPECT_EQ(s.largest_block, largest) << what;
    EXPECT_EQ(s.moe_layers, 2) << what;
    auto whole = g;
    whole.tensor_parallel = 1;
    whole.moe.expert_tensor_parallel = false;
    EXPECT_EQ(s.whole_model, model::Gpt::layout_for(whole).numel()) << what;
  }
  auto g = shape(4, 64, 4, 32, 300);
  g.moe.num_experts = {4};
  EXPECT_THROW(gpt_size(g, 3), Error);  // 3 does not divide 4 experts
}

// TED's headline shape (Singh et al. 2023): a 6.7B base (32 layers, h 4096, 32 heads, seq 2048)
// with 16 experts on every other layer is the paper's "40B-parameter MoE" (ours: 38.9B, the paper
// rounds). On 128 devices at T=4, EP=16 (D=2), ZeRO-1 in mixed precision: the dense states over
// the 32 data-parallel ranks of a tensor index, each rank's 1 expert per MoE layer over its 2
// expert-data-parallel ranks.
TEST(MemoryEstimate, TedPaperShape) {
  auto g = shape(32, 4096, 32, 2048, 50257);
  g.moe.num_experts = {16};
  EXPECT_NEAR(gpt_size(g, 1).whole_model / 1e9, 38.9, 0.05);
  g.tensor_parallel = 4;
  g.moe.expert_tensor_parallel = true;
  const GptSize s = gpt_size(g, 16);
  EXPECT_EQ(s.experts, 16u * s.expert);  // one expert per MoE layer per rank
  const MemoryPlan p = plan_memory(s, StatePrecision::mixed, 1, Offload::none, gpus(16, 8, 32));
  const uint64_t part = (s.dense + 31) / 32 + (s.experts + 1) / 2;
  EXPECT_EQ(p.device_states, 4 * s.params + (2 + 12) * part);
  // Stage 2: one gradient bucket per engine (dense; experts), each at least its group's largest block.
  const MemoryPlan p2 = plan_memory(s, StatePrecision::mixed, 2, Offload::none, gpus(16, 8, 32));
  const uint64_t bucket = 500000000ull;
  EXPECT_EQ(p2.device_buffers, 2 * 2 * (std::max(s.largest_dense_block, std::min(bucket, s.dense)) +
                                        std::max(s.expert, std::min(bucket, s.experts))))
      << "a 16-bit gradient bucket and a 16-bit all-gather bucket of the same size, per engine";
  EXPECT_LT(p.ds_device, 0);  // DeepSpeed's estimators know no experts: not shown
  EXPECT_THROW(plan_memory(gpt_size(g, 16), StatePrecision::mixed, 1, Offload::none, gpus(1, 8, 32)), Error);  // 2 dp ranks, EP 16
}

TEST(MemoryEstimate, GptNamesComeOutNearTheirSizes) {
  // GPT-2 vocabulary, padded to 50304 as a real run does.
  EXPECT_NEAR(gpt_size(shape(96, 12288, 96, 2048, 50257)).params / 1e9, 174.6, 0.1);
  EXPECT_NEAR(gpt_size(shape(105, 20480, 128, 2048, 50257)).params / 1e9, 529.6, 0.1);
  EXPECT_NEAR(gpt_size(shape(128, 25600, 160, 1024, 50257)).params / 1e12, 1.008, 0.001);
  EXPECT_NEAR(gpt_size(shape(160, 32768, 256, 2048, 50257)).params / 1e12, 2.063, 0.001);
  EXPECT_EQ(gpt_size(shape(96, 12288, 96, 2048, 50257)).largest_block_name, "layer");
  EXPECT_EQ(gpt_size(shape(2, 64, 2, 64, 50257)).largest_block_name, "embedding");
}

// ZeRO paper Fig. 1 / reference §3.1: Ψ = 7.5B, N = 64, K = 12.
TEST(MemoryEstimate, ZeroPaperAnchors) {
  const GptSize s = size_of(7500000000ull);
  const ClusterShape c = gpus(8, 8, 80);
  auto dev = [&](int stage) { return plan_memory(s, StatePrecision::mixed, stage, Offload::none, c).device_states; };
  EXPECT_EQ(dev(0), 120000000000ull);  // (2+2+K)Ψ = 120 GB
  // (2+2)Ψ + KΨ/N = 31.4 GB in the paper; ZeroEngine also holds the reduced 16-bit gradient
  // partition the optimizer reads (2Ψ/N = 0.23 GB), as DeepSpeed's step does an fp32 one.
  EXPECT_EQ(dev(1), 31406250000ull + 234375000ull);
  EXPECT_EQ(dev(2), 16640625000ull);   // 2Ψ + (2+K)Ψ/N = 16.6 GB
  EXPECT_EQ(dev(3), 1875000000ull);    // (2+2+K)Ψ/N = 1.9 GB
  EXPECT_NEAR((dev(1) - 2 * 7500000000ull / 64) / 1e9, 31.4, 0.05);
  EXPECT_NEAR(dev(2) / 1e9, 16.6, 0.05);
  EXPECT_NEAR(dev(3) / 1e9, 1.9, 0.05);
}

// DeepSpeed ZeRO tutorial: Adam states (K = 12) of a 1.5B GPT-2 are 18 GB; ZeRO-1 over 8 ranks 2.25 GB.
TEST(MemoryEstimate, DeepSpeedTutorialAnchor) {
  const GptSize s = size_of(1500000000ull);
  const auto p0 = plan_memory(s, StatePrecision::mixed, 0, Offload::none, gpus(1, 8, 80));
  const auto p1 = plan_memory(s, StatePrecision::mixed, 1, Offload::none, gpus(1, 8, 80));
  EXPECT_EQ(state_bytes(StatePrecision::mixed).optimizer * s.params, 18000000000ull);
  // The optimizer shrank to 1/8; stage 1 adds the reduced gradient partition (2Ψ/8).
  EXPECT_EQ(p0.device_states - p1.device_states + 2250000000ull + 2 * s.params / 8, 18000000000ull);
  EXPECT_EQ(p1.device_states - 4 * s.params - 2 * s.params / 8, 2250000000ull);
}

TEST(MemoryEstimate, FormulasBothPrecisions) {
  const uint64_t psi = 1000003;  // not a multiple of N: partitions round up
  const GptSize s = size_of(psi, 5000);
  const ClusterShape c = gpus(2, 4, 80);
  const uint64_t N = 8, part = (psi + N - 1) / N;
  for (auto prec : {StatePrecision::mixed, StatePrecision::fp32}) {
    const StateBytes b = state_bytes(prec);
    if (prec == StatePrecision::mixed) {
      EXPECT_EQ(b.param + b.grad + b.optimizer, 2u + 2u + 12u);
    } else {
      EXPECT_EQ(b.param, 4u);
      EXPECT_EQ(b.grad, 4u);
      EXPECT_EQ(b.optimizer, 8u);
    }
    auto plan = [&](int st, Offload o) { return plan_memory(s, prec, st, o, c); };
    EXPECT_EQ(plan(0, Offload::none).device_states, (b.param + b.grad + b.optimizer) * psi);
    EXPECT_EQ(plan(1, Offload::none).device_states, (b.param + b.grad) * psi + (b.grad + b.optimizer) * part);
    EXPECT_EQ(plan(2, Offload::none).device_states, b.param * psi + (b.grad + b.optimizer) * part);
    EXPECT_EQ(plan(3, Offload::none).device_states, (b.param + b.grad + b.optimizer) * part);
    // Offloaded optimizer: the CPU step's 16 bytes per partitioned parameter go to the host.
    EXPECT_EQ(plan(1, Offload::optimizer_cpu).device_states, (b.param + b.grad) * psi);
    // Stage 2 on GPUs: the device store's gradient sum stays beside the parameters (DeviceStore);
    // ranks in host memory (the CPU engine) reduce it into buckets.
    EXPECT_EQ(plan(2, Offload::optimizer_cpu).device_states, (b.param + b.grad) * psi);
    EXPECT_EQ(plan_memory(s, prec, 2, Offload::optimizer_cpu, ClusterShape{}).device_states, b.param * psi);
    EXPECT_EQ(plan(3, Offload::optimizer_cpu).device_states, b.param * part);
    EXPECT_EQ(plan(2, Offload::optimizer_cpu).host_states_per_rank, 16 * part);
    EXPECT_EQ(plan(2, Offload::optimizer_cpu).host_per_node, 4 * 16 * part);
    // NVMe takes the 3 fp32 optimizer arrays (12 bytes); the fp32 gradient (4) stays on the host.
    EXPECT_EQ(plan(3, Offload::optimizer_nvme).nvme_per_node, 4 * 12 * part);
    EXPECT_EQ(plan(3, Offload::optimizer_nvme).host_states_per_rank, 4 * part);
    EXPECT_EQ(plan(3, Offload::optimizer_nvme).host_buffers_per_rank, 4 * 3 * 4 * std::min<uint64_t>(1 << 20, part));
    EXPECT_EQ(plan(3, Offload::optimizer_param_cpu).device_states, 0u);
    const uint64_t params_too = prec == StatePrecision::mixed ? 2 : 0;  // fp32: the master is the parameter
    EXPECT_EQ(plan(3, Offload::optimizer_param_cpu).host_states_per_rank, (16 + params_too) * part);
    EXPECT_EQ(plan(3, Offload::optimizer_param_nvme).nvme_per_rank, (12 + params_too) * part);
    EXPECT_EQ(plan(3, Offload::optimizer_param_nvme).host_states_per_rank, 4 * part);
    // Stated working buffers: stage 2 one bucket (Ψ here is under reduce_bucket_size), and on
    // these GPUs at stages 1-2 the reduce-scatters and the parameter all-gathers under way beside
    // the compute (Ψ is under allgather_bucket_size too); stage 3
    // two gathered blocks + a prefetch of min(5e7, Ψ), at most Ψ in all, + one block's gradient.
    EXPECT_EQ(plan(2, Offload::none).device_buffers, b.grad * psi + b.param * psi);
    EXPECT_EQ(plan(1, Offload::none).device_buffers, b.grad * psi + b.param * psi);
    EXPECT_EQ(plan_memory(s, prec, 2, Offload::none, gpus(2, 4, 0)).device_buffers, b.grad * psi)
        << "CPU ranks (device memory 0: the host's): the host engine gathers a block at a time";
    EXPECT_EQ(plan(3, Offload::none).device_buffers, b.param * psi + b.grad * 5000);
    EXPECT_EQ(plan(0, Offload::none).device_buffers, 0u);
  }
}

TEST(MemoryEstimate, OffloadChoicesFollowDeepSpeed) {
  EXPECT_FALSE(offload_allowed(0, Offload::optimizer_cpu));
  EXPECT_TRUE(offload_allowed(1, Offload::optimizer_cpu));
  EXPECT_FALSE(offload_allowed(2, Offload::optimizer_nvme));
  EXPECT_FALSE(offload_allowed(2, Offload::optimizer_param_cpu));
  EXPECT_TRUE(offload_allowed(3, Offload::optimizer_param_nvme));
  EXPECT_THROW(plan_memory(size_of(1000), StatePrecision::mixed, 2, Offload::optimizer_nvme, gpus(1, 1, 1)), Error);
  EXPECT_THROW(plan_memory(size_of(1000), StatePrecision::mixed, 4, Offload::none, gpus(1, 1, 1)), Error);
  auto e = estimate_memory(shape(2, 64, 2, 64, 256), StatePrecision::fp32, gpus(1, 2, 1));
  EXPECT_EQ(e.plans.size(), 4u + 3u + 3u);  // none x4, optimizer:cpu x3, stage-3 nvme / param x3
}

TEST(MemoryEstimate, DeepSpeedEstimatorsSideBySide) {
  // Ψ = 7.5B with a largest layer of 1e8 on 8 nodes x 8 GPUs; 16-bit training only.
  const GptSize s = size_of(7500000000ull, 100000000ull);
  const ClusterShape c = gpus(8, 8, 80);
  const double P = 7.5e9, N = 64, L = 1e8;
  auto ds = [&](int st, Offload o) { return plan_memory(s, StatePrecision::mixed, st, o, c); };
  EXPECT_DOUBLE_EQ(ds(2, Offload::none).ds_device, 4 * P + 16 * P / N);
  EXPECT_DOUBLE_EQ(ds(2, Offload::optimizer_cpu).ds_device, 2 * P);
  EXPECT_DOUBLE_EQ(ds(2, Offload::optimizer_cpu).ds_host_per_node, P * 4 * N * 1.5);
  EXPECT_DOUBLE_EQ(ds(3, Offload::none).ds_device, 4 * L + 18 * P / N);
  EXPECT_DOUBLE_EQ(ds(3, Offload::optimizer_cpu).ds_device, 4 * L + 2 * P / N);
  EXPECT_DOUBLE_EQ(ds(3, Offload::optimizer_param_cpu).ds_device, 4 * L);
  EXPECT_DOUBLE_EQ(ds(3, Offload::optimizer_param_cpu).ds_host_per_node, 18 * P / 8 * 1.5);
  EXPECT_LT(ds(1, Offload::none).ds_device, 0);  // DeepSpeed has no stage-1 estimator
  EXPECT_LT(plan_memory(s, StatePrecision::fp32, 3, Offload::none, c).ds_device, 0);
  EXPECT_EQ(ds(3, Offload::none).device_states, 16 * 7500000000ull / 64);  // ours: the paper's 16Ψ/N
}

TEST(MemoryEstimate, FitsFlipsWithTheCluster) {
  // 175B, mixed precision, 8 nodes x 8 GPUs of 80 GB: stage 3 fits, stage 2 (2Ψ = 349 GB) does not.
  const auto g = shape(96, 12288, 96, 2048, 50257);
  auto e = estimate_memory(g, StatePrecision::mixed, gpus(8, 8, 80, 1000, 0));
  auto find = [&](const MemoryEstimate& est, int st, Offload o) {
    for (const auto& p : est.plans)
      if (p.stage == st && p.offload == o) return p;
    throw std::runtime_error("plan missing");
  };
  EXPECT_FALSE(find(e, 0, Offload::none).fits());
  EXPECT_FALSE(find(e, 2, Offload::none).fits());
  EXPECT_TRUE(find(e, 3, Offload::none).fits());
  EXPECT_FALSE(find(e, 3, Offload::optimizer_nvme).fits_nvme);  // no NVMe given
  EXPECT_EQ(find(e, 3, Offload::optimizer_nvme).fit_text(), "no (nvme)");
  // On one node the device no longer holds stage 3's 16Ψ/8, but parameter offload to NVMe fits.
  auto one = estimate_memory(g, StatePrecision::mixed, gpus(1, 8, 80, 1000, 30000));
  EXPECT_FALSE(find(one, 3, Offload::none).fits_device);
  EXPECT_FALSE(find(one, 3, Offload::optimizer_param_cpu).fits_host);
  EXPECT_TRUE(find(one, 3, Offload::optimizer_param_nvme).fits());
}

TEST(MemoryEstimate, HostProcessesShareHostMemory) {
  // CPU backend: device_bytes 0, two ranks; their device states count against the node's memory.
  const auto g = shape(4, 128, 4, 128, 512);
  ClusterShape c = gpus(1, 2, 0, 1, 0);
  auto e = estimate_memory(g, StatePrecision::fp32, c);
  const auto& p0 = e.plans.front();
  EXPECT_TRUE(p0.fits_device);
  EXPECT_EQ(p0.host_per_node, 2 * p0.device_total());
  EXPECT_TRUE(p0.fits());
  c.host_bytes = p0.host_per_node - 1;
  EXPECT_FALSE(estimate_memory(g, StatePrecision::fp32, c).plans.front().fits_host);
}

TEST(MemoryEstimate, BadClusterNamesTheFlag) {
  ClusterShape c = gpus(0, 8, 80);
  try {
    c.validate();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--estimate-nodes"), std::string::npos) << e.what();
  }
  c = gpus(1, 8, 80, 0);
  EXPECT_THROW(c.validate(), Error);
  auto bad = shape(2, 65, 2, 64, 256);  // hidden not divisible by heads
  EXPECT_THROW(gpt_size(bad), Error);
}

// LoRA: Ψ is what trains (the adapters, and the modules to save) and F the frozen base, both as the
// model's own layout counts them; F adds param-bytes x F to every rank whatever the stage, and in
// 16-bit runs the widened blocks in use to the buffers. Under tensor parallelism (T = 3) both are
// this rank's part, and the whole model counts every tensor whole.
TEST(MemoryEstimate, LoraCountsWhatTrainsAndTheFrozenBaseApart) {
  struct Case {
    unsigned targets, save;
  };
  // save: a bit per LoraConfig::Module (1 final norm, 2 embedding, 4 position embedding alone)
  for (auto k : {Case{0xF, 0}, Case{0x1F, 0}, Case{0x3, 1}, Case{0x10, 1}, Case{0xC, 2}, Case{0x1F, 3}, Case{0x1F, 4},
                 Case{0xF, 5}, Case{0x1, 6}})
  for (int tp : {1, 3}) {
    model::GptConfig g = shape(3, 96, 3, 40, 1000);
    g.ffn_hidden_size = k.save & 1 ? 150 : 0;  // --ffn-hidden-size in some cases (divisible by T = 3)
    if (k.save & 2) g.normalization = model::NormKind::rmsnorm;
    if (k.save == 1 && !(k.targets & 0x10)) g.untie_embeddings = true;  // a frozen output layer of its own
    if (k.targets & 4) {  // LoRA on a SwiGLU fc: B is 2F x r (its default width, 256, does not split over 3)
      g.mlp = model::MlpKind::swiglu;
      if (!g.ffn_hidden_size) g.ffn_hidden_size = 192;
    }
    g.lora.rank = 4;
    g.lora.targets = k.targets;
    g.lora.modules_to_save = k.save;
    g.tensor_parallel = tp;
    const ParamLayout l = model::Gpt::layout_for(g, tp - 1);
    const GptSize s = gpt_size(g);
    const std::string what = g.describe() + " T=" + std::to_string(tp);
    EXPECT_EQ(s.params, l.trained().numel()) << what;
    EXPECT_EQ(s.dense, s.params) << what;
    uint64_t frozen = 0, largest = 0;
    for (const auto& b : l.blocks()) {
      if (b.trains) largest = std::max<uint64_t>(largest, b.numel);
      else frozen += b.numel;
    }
    EXPECT_EQ(s.frozen, frozen) << what;
    EXPECT_EQ(s.largest_block, largest) << what;
    model::GptConfig one = g;  // the whole model: at T = 1
    one.tensor_parallel = 1;
    EXPECT_EQ(s.whole_model, model::Gpt::layout_for(one).numel()) << what;
    EXPECT_EQ(s.params + s.frozen, l.numel()) << what;
    // widened while in use in 16-bit runs: the frozen embedding block (the words) and one layer, or
    // the untied output layer at the end
    const uint64_t layer = l.blocks()[l.find("layers.0.input_layernorm.weight").block].numel;
    const uint64_t head = g.untie_embeddings ? l.blocks()[l.find("output_layer.weight").block].numel : 0;
    const uint64_t working = (l.blocks()[0].trains ? 0 : l.blocks()[0].numel) + std::max(layer, head);
    EXPECT_EQ(s.frozen_working, working) << what;
  }
  model::GptConfig g = shape(12, 768, 12, 1024, 50257);  // GPT-2 124M, rank 8 on the four linears
  g.lora.rank = 8;
  const GptSize s = gpt_size(g), full = gpt_size(shape(12, 768, 12, 1024, 50257));
  EXPECT_EQ(s.params, 12u * 8 * (4 * 768 + 2 * 768 + 5 * 768 + 5 * 768)) << "rank x (in + out) of each linear, per layer";
  EXPECT_EQ(s.frozen, full.params);
  EXPECT_EQ(s.frozen_working, full.embedding + full.layer);
  const ClusterShape c = gpus(1, 8, 80);
  for (auto prec : {StatePrecision::mixed, StatePrecision::fp32}) {
    const StateBytes b = state_bytes(prec);
    for (int stage = 0; stage <= 3; ++stage) {
      const MemoryPlan with = plan_memory(s, prec, stage, Offload::none, c);
      GptSize alone = s;  // the same adapters without a frozen base
      alone.frozen = alone.frozen_working = 0;
      const MemoryPlan without = plan_memory(alone, prec, stage, Offload::none, c);
      EXPECT_EQ(with.device_states - without.device_states, b.param * s.frozen) << "stage " << stage;
      EXPECT_EQ(with.device_buffers - without.device_buffers, prec == StatePrecision::mixed ? 4 * s.frozen_working : 0);
      EXPECT_NE(with.formula.find(std::to_string(b.param) + "F"), std::string::npos) << with.formula;
    }
    const MemoryPlan off = plan_memory(s, prec, 3, Offload::optimizer_param_cpu, c);
    EXPECT_EQ(off.device_states, 0u);
    EXPECT_GE(off.host_states_per_rank, b.param * s.frozen) << "with parameter offload the base is the host's";
  }
  // The point of LoRA: 124M at stage 0 in bf16 needs 16 bytes per parameter finetuned in full, about
  // 2 with rank-8 adapters.
  EXPECT_LT(plan_memory(s, StatePrecision::mixed, 0, Offload::none, c).device_states,
            plan_memory(full, StatePrecision::mixed, 0, Offload::none, c).device_states / 7);
}
