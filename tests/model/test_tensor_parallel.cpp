// Tensor parallelism's layers against the unsplit ones, under mpirun with T = the world size.
//
// - The whole model, one layer of every kind at once: a T-rank Gpt and a one-rank Gpt start from
//   the same weights (init is layout-independent: the parts must equal slices of the one-rank
//   tensors, bitwise); one forward/backward; the loss and every gradient, assembled from the parts,
//   must equal the one-rank model's. Tolerance: the row-parallel linears, the all-reduced input
//   gradients and the vocab-parallel softmax sum the same products in another order (partial sums
//   per rank, then across ranks), and the cross entropy uses std::exp where the backend's kernel
//   uses its own exp: fp32 rounding, ~1e-7 relative per sum. We allow 1e-5 relative on the loss and
//   2e-5 x max|g| on every gradient element (measured: <= 5e-7 x max|g| at T = 2 and 4); a missing all-reduce or a
//   bias added T times is off by O(1) x |g|.
// - The vocab-parallel embedding against the backend's: bitwise (one nonzero row per token, summed
//   with zeros, then the same position add).
// - The vocab-parallel cross entropy against the backend's whole-row one: loss and gradient within
//   1e-6 (relative to the loss, absolute on gradients that are O(1/V)); padding never takes part;
//   and its gradient against central finite differences of the distributed loss.
// - Sequence parallelism equals its absence: the same whole-model check with --sequence-parallel
//   (norms on N/T rows, all-gather / reduce-scatter), same tolerances (the norms' weight gradients
//   become per-rank partial sums plus a sum over ranks: again fp32 reordering), and the collectives'
//   payload and ring bytes against the count below.
// - f/g: Megatron's rank-valued check, exact sums.
// - The device paths (a backend whose memory is not the host's: collectives staged through host
//   buffers), on the CPU ops behind staged_cpu_ops.hpp: bitwise the CPU backend's loss, gradients and
//   collective bytes (the same ops in the same order; only the buffers travel), with sequence
//   parallelism, LoRA, a residual MoE layer and tensor-parallel experts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "../engine/mpi_gtest_main.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/model/gpt.hpp"
#include "hpct/model/tensor_parallel.hpp"
#include "host_device_collectives.hpp"
#include "staged_cpu_ops.hpp"

using namespace hpct;

using test::world;

namespace {

// The model options beside the layout: the MLPs' width (0: 4 x 16) and the norms' kind.
struct Shape {
  int ffn = 0;
  model::NormKind norm = model::NormKind::layernorm;
  model::MlpKind mlp = model::MlpKind::gelu;
  bool bias = true;  // false: --disable-bias-linear
  bool untie = false;  // --untie-embeddings-and-output-weights
  bool rotary = false;  // --use-rotary-position-embeddings (theta 100)
  int heads = 4, kv_heads = 0;  // --num-attention-heads, --num-key-value-heads (0: one per head)
};

model::GptConfig tiny(int tp, bool moe, bool residual, bool sp = false, bool etp = false, Shape shape = {}) {
  model::GptConfig c;
  c.ffn_hidden_size = shape.ffn;
  c.normalization = shape.norm;
  c.mlp = shape.mlp;
  c.linear_bias = shape.bias;
  c.untie_embeddings = shape.untie;
  c.rotary = shape.rotary;
  c.num_heads = shape.heads;
  c.num_kv_heads = shape.kv_heads;
  c.rope_theta = 100;
  c.moe.expert_tensor_parallel = etp;
  c.sequence_parallel = sp;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.max_seq_length = 8;
  c.vocab_size = 29;  // padded to 32: the last rank's slice holds padding
  c.vocab_multiple = 8;
  c.init_std = 0.2;
  c.tensor_parallel = tp;
  if (moe) {
    c.moe.num_experts = {4};
    c.moe.expert_interval = 2;
    c.moe.residual = residual;
    c.moe.second_expert_sampling = false;
  }
  return c;
}

// Every tensor whole, in layout order, from this rank's parts (summed over the group).
std::vector<float> assemble(const ParamLayout& l, const std::vector<float>& local, const comm::Communicator& tp) {
  std::vector<float> full(l.full_numel(), 0.0f);
  size_t at = 0;
  for (const auto& t : l.tensors()) {
    if (t.primary())
      t.for_full_runs(0, t.numel, [&](uint64_t f, uint64_t lo, uint64_t n) {
        std::copy_n(local.begin() + t.offset + lo, n, full.begin() + at + f);
      });
    at += t.full_numel();
  }
  tp.allreduce_sum(full.data(), full.size());
  return full;
}

// documents: per-document attention and positions (gpt.hpp), token 3 ending the documents.
// ltd: random-LTD in layer 1 (4 of the 8 tokens of each sample; under sequence parallelism the kept
// sub-batch is split over the ranks too).
void check_model(bool moe, bool residual, bool sp = false, bool etp = false, bool dropout = false,
                 bool documents = false, bool ltd = false, Shape shape = {}) {
  const auto& w = world();
  const int T = w.size();
  model::GptConfig rc = tiny(1, moe, residual, false, false, shape), pc = tiny(T, moe, residual, sp, etp, shape);
  if (dropout) rc.attention_dropout = pc.attention_dropout = rc.hidden_dropout = pc.hidden_dropout = 0.2;
  if (documents)
    for (auto* c : {&rc, &pc}) c->reset_attention_mask = c->reset_position_ids = true, c->eod_token = 3;
  model::Gpt ref(rc, kernels::Precision::fp32, false);
  model::Gpt par(pc, kernels::Precision::fp32, false, nullptr, nullptr, T > 1 ? &w : nullptr);
  ref.set_dropout_seed(77, 1000);
  par.set_dropout_seed(77, 1000);
  if (ltd)
    for (model::Gpt* g : {&ref, &par}) {
      g->set_random_ltd_layers({1});
      g->set_kept_tokens(4, 31, 500);
    }
  std::vector<float> rp(ref.layout().numel()), rg(rp.size(), 0.0f), pp(par.layout().numel()), pg(pp.size(), 0.0f);
  ref.init_params(rp.data(), 42);
  par.init_params(pp.data(), 42);
  if (etp && T > 1)
    EXPECT_EQ(par.layout().find("layers.1.mlp.experts.0.dense_h_to_4h.weight").numel,
              (shape.mlp == model::MlpKind::swiglu ? 2u : 1u) * rc.ffn() * 16 / T)
        << "experts not split";
  const std::vector<float> assembled = assemble(par.layout(), pp, w);
  ASSERT_EQ(assembled.size(), rp.size());
  EXPECT_EQ(std::memcmp(assembled.data(), rp.data(), rp.size() * 4), 0) << "a part is not its slice of the T=1 init";
  const int B = 2, S = 8;
  std::vector<int32_t> tok(B * S), tgt(B * S);
  Rng rng(7);
  for (int i = 0; i < B * S; ++i) tok[i] = (int)rng.below(29), tgt[i] = i % 5 == 0 ? -1 : (int)rng.below(29);
  if (documents) tok[2] = tok[5] = tok[S + 4] = 3;  // documents of 3, 3 and 2 tokens; of 5 and 3
  model::FlatParamStore rs(ref.layout(), rp.data(), rg.data()), ps(par.layout(), pp.data(), pg.data());
  ref.set_routing_seed(3);
  par.set_routing_seed(3);
  const double lr = ref.forward_backward(rs, tok.data(), tgt.data(), B, S, 0.05f);
  const double lp = par.forward_backward(ps, tok.data(), tgt.data(), B, S, 0.05f);
  EXPECT_NEAR(lp, lr, 1e-5 * std::fabs(lr));
  const std::vector<float> g = assemble(par.layout(), pg, w);
  float gmax = 0;
  for (float x : rg) gmax = std::max(gmax, std::fabs(x));
  size_t at = 0;
  double worst_all = 0;
  for (const auto& t : ref.layout().tensors()) {
    double worst = 0;
    for (size_t i = 0; i < t.numel; ++i) worst = std::max(worst, (double)std::fabs(g[at + i] - rg[at + i]));
    EXPECT_LE(worst, 2e-5 * gmax) << t.name << " on T=" << T;
    worst_all = std::max(worst_all, worst);
    at += t.numel;
  }
  if (w.rank() == 0)
    std::printf("T=%d%s%s%s%s%s MLP width %d %s: loss %.9g vs %.9g, largest gradient difference %.2e x max|g|\n", T,
                sp ? " sequence-parallel" : "", etp ? " expert-tensor-parallel" : "", dropout ? " dropout" : "",
                documents ? " documents" : "", ltd ? " random-LTD" : "", rc.ffn(), model::norm_name(rc.normalization), lp, lr,
                worst_all / gmax);
  // Replicas' gradients are the same on every rank of the group (the same inputs, the same sums).
  for (const auto& t : par.layout().tensors()) {
    if (t.partitioned()) continue;
    std::vector<float> mine(pg.begin() + t.offset, pg.begin() + t.offset + t.numel), first = mine;
    w.bcast_bytes(first.data(), first.size() * 4, 0);
    EXPECT_EQ(std::memcmp(first.data(), mine.data(), mine.size() * 4), 0) << t.name << " differs across ranks";
  }
  if (ltd) return;  // a shorter layer and the stream's gathers: other byte counts
  // Megatron's count: 2 all-reduces of (B*s, h) per layer forward and 2 backward, plus the
  // embedding's (forward) and the LM head's input gradient (backward). A standard MoE layer has
  // only the attention's (its experts are not split, or split and counted by the MoE layer itself); a
  // residual one adds its dense MLP's.
  const double act = double(B) * S * 16 * sizeof(float);  // one (B*s, h) buffer
  const int per_layer = moe && !residual ? 4 + 2 : 4 + 4;
  const double ring = 2.0 * (T - 1) / T;  // an all-reduce's bytes per rank on a ring, per payload byte
  const auto& tpc = par.tensor_parallel();
  if (!sp || T == 1) {
    EXPECT_EQ(tpc.activation_bytes(), T > 1 ? (per_layer + 2.0) * act : 0.0);
    EXPECT_DOUBLE_EQ(tpc.activation_wire_bytes(), (per_layer + 2.0) * act * ring);
    return;
  }
  // Sequence parallel: each all-reduce of a dense layer becomes an all-gather and a reduce-scatter
  // (4 + 4 of (B*s, h), each half a ring all-reduce's bytes), as do the embedding's and the head's.
  // An MoE layer gathers ln2 forward and the output gradient backward and routes every row on every
  // rank (its experts are not split), 2 + 2 + 2; a residual one adds its dense MLP's 2 all-reduces.
  // The tiny model: layer 1 dense, layer 2 MoE when moe.
  const int gathers_scatters = 8 + (moe ? 6 : 8), allreduces = moe && residual ? 2 : 0;
  EXPECT_EQ(tpc.activation_bytes(), (gathers_scatters + allreduces + 4.0) * act);
  EXPECT_DOUBLE_EQ(tpc.activation_wire_bytes(), ((gathers_scatters + 4.0) * ring / 2 + allreduces * ring) * act);
  if (!moe) {
    EXPECT_DOUBLE_EQ(tpc.activation_wire_bytes(), (per_layer + 2.0) * act * ring) << "not what it replaces";
  }
}
}  // namespace

TEST(TensorParallel, GptMatchesUnsplitModel) { check_model(false, false); }
// --ffn-hidden-size: MLPs 24 wide instead of 64 (divisible by T = 1, 2, 4), dense and split experts.
TEST(TensorParallel, GptWithMlpWidthMatchesUnsplitModel) { check_model(false, false, true, false, false, false, false, {24}); }
TEST(TensorParallel, ExpertTensorParallelResidualMoeWithMlpWidthMatchesUnsplitModel) {
  check_model(true, true, false, true, false, false, false, {24});
}
// --normalization rmsnorm: with sequence parallelism the norms' weight gradients are partial sums.
TEST(TensorParallel, SequenceParallelRmsNormGptMatchesUnsplitModel) {
  check_model(false, false, true, false, false, false, false, {0, model::NormKind::rmsnorm});
}
// --swiglu: fc's rows are gate then up, each rank holding its part of both (a stride-2 split).
TEST(TensorParallel, SequenceParallelSwiGluGptMatchesUnsplitModel) {
  check_model(false, false, true, false, false, false, false, {24, model::NormKind::rmsnorm, model::MlpKind::swiglu});
}
// --disable-bias-linear (with Llama's norm and MLP): no row-parallel bias to add on rank 0 only.
TEST(TensorParallel, LlamaShapedGptWithoutBiasesMatchesUnsplitModel) {
  check_model(false, false, false, false, false, false, false, {24, model::NormKind::rmsnorm, model::MlpKind::swiglu, false});
}
// --untie-embeddings-and-output-weights: the output layer vocab-parallel as the embedding (with SP).
TEST(TensorParallel, SequenceParallelUntiedLlamaShapedGptMatchesUnsplitModel) {
  check_model(false, false, true, false, false, false, false,
              {24, model::NormKind::rmsnorm, model::MlpKind::swiglu, false, true, true});
}
// Grouped-query attention: 8 query heads on 4 key/value heads, each rank holding its part of the
// q, k and v sections (the Llama-shaped model, rotary positions included).
TEST(TensorParallel, GroupedQueryLlamaShapedGptMatchesUnsplitModel) {
  check_model(false, false, true, false, false, false, false,
              {24, model::NormKind::rmsnorm, model::MlpKind::swiglu, false, true, true, 8, 4});
}
// Rotary positions restart with each document (--reset-position-ids): the rotation follows them.
TEST(TensorParallel, RotaryGptWithDocumentsMatchesUnsplitModel) {
  check_model(false, false, false, false, false, true, false,
              {0, model::NormKind::layernorm, model::MlpKind::gelu, true, false, true});
}
TEST(TensorParallel, ExpertTensorParallelResidualSwiGluMoeMatchesUnsplitModel) {
  check_model(true, true, false, true, false, false, false, {24, model::NormKind::layernorm, model::MlpKind::swiglu});
}
TEST(TensorParallel, RmsNormMoeMatchesUnsplitModel) {
  check_model(true, false, false, false, false, false, false, {0, model::NormKind::rmsnorm});
}
TEST(TensorParallel, MoeMatchesUnsplitModel) { check_model(true, false); }
TEST(TensorParallel, ResidualMoeMatchesUnsplitModel) { check_model(true, true); }
TEST(TensorParallel, SequenceParallelGptMatchesUnsplitModel) { check_model(false, false, true); }
// Dropout (0.2 on every site): the masks are functions of the sample, position and global head, so
// the split model drops exactly what the whole one drops; same tolerances.
TEST(TensorParallel, GptWithDropoutMatchesUnsplitModel) { check_model(false, false, false, false, true); }
TEST(TensorParallel, SequenceParallelMoeWithDropoutMatchesUnsplitModel) { check_model(true, false, true, false, true); }
TEST(TensorParallel, SequenceParallelMoeMatchesUnsplitModel) { check_model(true, false, true); }
// Documents packed in a sample: attention and positions per document, from the tokens alone, so
// every rank derives the same; same tolerances.
TEST(TensorParallel, GptWithDocumentsMatchesUnsplitModel) { check_model(false, false, false, false, false, true); }
TEST(TensorParallel, SequenceParallelMoeWithDocumentsMatchesUnsplitModel) { check_model(true, false, true, false, false, true); }
// random-LTD: the kept positions are a function of the sample, the same on every rank; under
// sequence parallelism the stream is gathered, the kept sub-batch split; same tolerances.
TEST(TensorParallel, GptWithRandomLtdMatchesUnsplitModel) { check_model(false, false, false, false, false, false, true); }
TEST(TensorParallel, SequenceParallelGptWithRandomLtdAndDropoutMatchesUnsplitModel) {
  check_model(false, false, true, false, true, true, true);
}
TEST(TensorParallel, SequenceParallelMoeWithRandomLtdMatchesUnsplitModel) { check_model(true, false, true, false, false, false, true); }
TEST(TensorParallel, SequenceParallelResidualMoeMatchesUnsplitModel) { check_model(true, true, true); }

// --enable-expert-tensor-parallelism: every expert split like the dense MLP (fc column-, fc2
// row-parallel; the partial outputs summed over the group before they go back to their tokens).
TEST(TensorParallel, ExpertTensorParallelMoeMatchesUnsplitModel) { check_model(true, false, false, true); }
TEST(TensorParallel, ExpertTensorParallelResidualMoeMatchesUnsplitModel) { check_model(true, true, false, true); }
TEST(TensorParallel, ExpertTensorParallelSequenceParallelMoeMatchesUnsplitModel) { check_model(true, false, true, true); }

TEST(TensorParallel, SequenceParallelRefusesRowsItCannotSplit) {
  const auto& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs a tensor-parallel group";
  model::Gpt par(tiny(w.size(), false, false, true), kernels::Precision::fp32, false, nullptr, nullptr, &w);
  std::vector<float> p(par.layout().numel()), g(p.size(), 0.0f);
  par.init_params(p.data(), 1);
  model::FlatParamStore ps(par.layout(), p.data(), g.data());
  std::vector<int32_t> tok(3, 1), tgt(3, 2);  // 1 x 3 rows: not divisible by 2 or 4
  try {
    par.forward_backward(ps, tok.data(), tgt.data(), 1, 3, 1.0f);
    FAIL() << "3 rows split over " << w.size();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--sequence-parallel"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size " + std::to_string(w.size())), std::string::npos)
        << e.what();
  }
}

TEST(TensorParallel, ConjugateOperatorsSumExactly) {
  const auto& w = world();
  model::TensorParallel tp(&w);
  std::vector<float> x(5, float(w.rank()));
  tp.all_reduce(x.data(), x.size());
  const float want = w.size() * (w.size() - 1) / 2.0f;  // 0 + 1 + ... + (T-1)
  for (float v : x) EXPECT_EQ(v, w.size() > 1 ? want : 0.0f);
}

TEST(TensorParallel, EmbeddingEqualsTheBackendsBitwise) {
  const auto& w = world();
  const int T = w.size(), B = 2, S = 4, C = 8, Vp = 16 * T, Vl = Vp / T;
  std::vector<float> wte((size_t)Vp * C), wpe((size_t)S * C);
  Rng rng(5);
  for (auto& v : wte) v = (float)rng.normal();
  for (auto& v : wpe) v = (float)rng.normal();
  std::vector<int32_t> tok(B * S);
  for (auto& t : tok) t = (int)rng.below(Vp);
  std::vector<float> want((size_t)B * S * C), got(want.size());
  kernels::encoder_forward(want.data(), tok.data(), wte.data(), wpe.data(), B, S, C);
  model::TensorParallel tp(&w);
  tp.embedding_forward(got.data(), tok.data(), wte.data() + (size_t)w.rank() * Vl * C, wpe.data(), B, S, C,
                       w.rank() * Vl, Vl, nullptr);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
  // Sequence parallel: this rank's rows only (reduce-scattered), the same bits.
  model::TensorParallel sp(&w);
  sp.set_sequence_parallel(true);
  const size_t rows = sp.local_rows(B * S), first = sp.first_row(B * S);
  std::vector<float> mine(rows * C), scratch(want.size());
  sp.embedding_forward(mine.data(), tok.data(), wte.data() + (size_t)w.rank() * Vl * C, wpe.data(), B, S, C,
                       w.rank() * Vl, Vl, scratch.data());
  EXPECT_EQ(std::memcmp(mine.data(), want.data() + first * C, mine.size() * 4), 0);
  // Backward: this rank's rows of the full gradient, bitwise; positions whole on every rank.
  std::vector<float> dout(want.size());
  for (auto& v : dout) v = (float)rng.normal();
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f), pdwte((size_t)Vl * C, 0.0f), pdwpe(wpe.size(), 0.0f);
  kernels::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, S, C);
  tp.embedding_backward(pdwte.data(), pdwpe.data(), dout.data(), tok.data(), B, S, C, w.rank() * Vl, Vl);
  EXPECT_EQ(std::memcmp(pdwte.data(), dwte.data() + (size_t)w.rank() * Vl * C, pdwte.size() * 4), 0);
  EXPECT_EQ(std::memcmp(pdwpe.data(), dwpe.data(), dwpe.size() * 4), 0);
}

TEST(TensorParallel, CrossEntropyEqualsWholeRowAndFiniteDifferences) {
  const auto& w = world();
  const int T = w.size(), rows = 6, V = 8 * T - 3, Vp = 8 * T, Vl = 8;  // the last slice ends in padding
  std::vector<float> logits((size_t)rows * Vp);
  Rng rng(11);
  for (auto& v : logits) v = (float)(3 * rng.normal());
  for (int r = 0; r < rows; ++r)
    for (int j = V; j < Vp; ++j) logits[(size_t)r * Vp + j] = 100.0f;  // padding would win if it took part
  std::vector<int32_t> tgt = {0, V - 1, 3, -1, V / 2, 1};
  const float dloss = 0.25f;
  std::vector<float> whole = logits, wl(rows);
  kernels::softmax_cross_entropy(whole.data(), wl.data(), tgt.data(), dloss, rows, V, Vp);
  auto mine = [&](const std::vector<float>& full) {
    std::vector<float> p((size_t)rows * Vl);
    for (int r = 0; r < rows; ++r)
      std::copy_n(full.begin() + (size_t)r * Vp + w.rank() * Vl, Vl, p.begin() + (size_t)r * Vl);
    return p;
  };
  model::TensorParallel tp(&w);
  std::vector<float> part = mine(logits), pl(rows);
  tp.cross_entropy(part.data(), pl.data(), tgt.data(), dloss, rows, Vl, w.rank() * Vl, V, true);
  const std::vector<float> want = mine(whole);
  for (int r = 0; r < rows; ++r) EXPECT_NEAR(pl[r], wl[r], 1e-6 * std::max(1.0f, wl[r])) << "row " << r;
  for (size_t i = 0; i < part.size(); ++i) EXPECT_NEAR(part[i], want[i], 1e-6) << "element " << i;
  // Finite differences of the distributed loss (sum over rows, x dloss): rank q moves one of its
  // logits, the others none, and every rank takes part in each (collective) evaluation.
  auto loss_at = [&](bool moved, int r, int j, float h) {
    std::vector<float> p = mine(logits), l(rows);
    if (moved) p[(size_t)r * Vl + j] += h;
    tp.cross_entropy(p.data(), l.data(), tgt.data(), 0.0f, rows, Vl, w.rank() * Vl, V, false);
    return dloss * std::accumulate(l.begin(), l.end(), 0.0);
  };
  for (int q = 0; q < T; ++q)
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < Vl; j += 3) {
        const float eps = 1e-2f;
        const bool me = w.rank() == q;
        const double fd = (loss_at(me, r, j, eps) - loss_at(me, r, j, -eps)) / (2 * eps);
        if (me) EXPECT_NEAR(part[(size_t)r * Vl + j], fd, 2e-4 + 1e-2 * std::fabs(fd)) << "row " << r << " column " << j;
      }
}

// on_device: the collectives on the "device" buffers (host_device_collectives.hpp, where a GPU run
// has NCCL) instead of staged through host copies.
void check_staged(bool sp, bool lora, bool moe = false, bool residual = false, bool etp = false,
                  bool on_device = false) {
  const auto& w = world();
  const int T = w.size();
  model::GptConfig c = tiny(T, moe, residual, sp, etp);
  if (lora) c.lora.rank = 2, c.lora.alpha = 4, c.lora.targets = 0x1F;
  test::StagedCpuOps staged;
  test::HostDeviceCollectives dc(w);
  const comm::Communicator* tp = T > 1 ? &w : nullptr;
  model::Gpt host(c, kernels::Precision::fp32, false, nullptr, nullptr, tp);
  model::Gpt dev(c, kernels::Precision::fp32, false, &staged, nullptr, tp);
  if (on_device) dev.set_tensor_parallel_device_comm(&dc, 60);
  ASSERT_EQ(dev.tensor_parallel().device_collectives(), on_device && T > 1);
  host.set_routing_seed(3), dev.set_routing_seed(3);
  std::vector<float> p(host.layout().numel()), hg(p.size(), 0.0f), dg(p.size(), 0.0f);
  host.init_params(p.data(), 42);
  for (size_t i = 0; i < p.size(); ++i)  // LoRA's zero factor off zero (harmless without LoRA: all weights move alike)
    if (p[i] == 0.0f) p[i] = 0.01f * float(int(i % 5) - 2);
  std::vector<float> dp = p;
  model::FlatParamStore hs(host.layout(), p.data(), hg.data()), ds(dev.layout(), dp.data(), dg.data());
  const int B = 2, S = 8;
  std::vector<int32_t> tok(B * S), tgt(B * S);
  Rng rng(9);
  for (int i = 0; i < B * S; ++i) tok[i] = (int)rng.below(29), tgt[i] = i % 7 == 0 ? -1 : (int)rng.below(29);
  const double lh = host.forward_backward(hs, tok.data(), tgt.data(), B, S, 0.05f);
  const double ld = dev.forward_backward(ds, tok.data(), tgt.data(), B, S, 0.05f);
  EXPECT_EQ(ld, lh);
  EXPECT_EQ(std::memcmp(dg.data(), hg.data(), hg.size() * 4), 0) << "gradients differ";
  EXPECT_EQ(dev.forward_loss(ds, tok.data(), tgt.data(), B, S), host.forward_loss(hs, tok.data(), tgt.data(), B, S));
  EXPECT_EQ(dev.tensor_parallel().bytes(), host.tensor_parallel().bytes());
  EXPECT_EQ(dev.moe_tp_bytes(), host.moe_tp_bytes());
  if (T == 1) return;
  if (!on_device) {
    EXPECT_GT(staged.bytes_to_host(), dev.tensor_parallel().bytes() / 2) << "the collectives were not staged";
    return;
  }
  // Every collective on the device buffers, each after the backend's queue drained; none staged
  // (what still comes to the host: the losses, and MoE's routing and duplicate token dropping).
  EXPECT_GE(dc.calls(), dev.tensor_parallel().calls());
  EXPECT_EQ(staged.synchronizations(), dc.calls());
  if (!moe) EXPECT_LT(staged.bytes_to_host(), dev.tensor_parallel().bytes() / 20);
}

TEST(TensorParallel, StagedThroughTheHostAsOnADevice) { check_staged(false, false); }
TEST(TensorParallel, SequenceParallelStagedThroughTheHost) { check_staged(true, false); }
TEST(TensorParallel, LoraStagedThroughTheHost) { check_staged(false, true); }
TEST(TensorParallel, SequenceParallelResidualMoeStagedThroughTheHost) { check_staged(true, false, true, true); }
TEST(TensorParallel, ExpertTensorParallelMoeStagedThroughTheHost) { check_staged(false, false, true, false, true); }
TEST(TensorParallel, DeviceCollectives) { check_staged(false, false, false, false, false, true); }
TEST(TensorParallel, SequenceParallelDeviceCollectives) { check_staged(true, false, false, false, false, true); }
TEST(TensorParallel, LoraDeviceCollectives) { check_staged(false, true, false, false, false, true); }
TEST(TensorParallel, ExpertTensorParallelMoeDeviceCollectives) { check_staged(false, false, true, false, true, true); }

// A device collective that fails (a peer gone, NCCL's deadline passed) stops the step with an error
// naming the collective and the rank, on every rank (here every rank fails the same call).
TEST(TensorParallel, FailedDeviceCollectiveNamesItself) {
  const auto& w = world();
  if (w.size() == 1) GTEST_SKIP() << "no collectives at T = 1";
  model::GptConfig c = tiny(w.size(), false, false, false, false);
  test::StagedCpuOps staged;
  test::HostDeviceCollectives dc(w, 2);
  model::Gpt dev(c, kernels::Precision::fp32, false, &staged, nullptr, &w);
  dev.set_tensor_parallel_device_comm(&dc, 60);
  std::vector<float> p(dev.layout().numel()), g(p.size(), 0.0f);
  dev.init_params(p.data(), 42);
  model::FlatParamStore ps(dev.layout(), p.data(), g.data());
  std::vector<int32_t> tok(16, 3), tgt(16, 4);
  try {
    dev.forward_backward(ps, tok.data(), tgt.data(), 2, 8, 0.05f);
    FAIL() << "the failed collective went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor-parallel all-reduce on device buffers, tensor-parallel rank " +
                                         std::to_string(w.rank()) + " of " + std::to_string(w.size()) +
                                         ": timeout: a peer did not answer"),
              std::string::npos)
        << e.what();
  }
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
